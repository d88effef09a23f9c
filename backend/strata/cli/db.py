"""``strata db upgrade`` and ``strata db current``: the SQL schema's version (``strata.stores.schema_version``).

Run ``strata db upgrade`` once per release, before the new pods start (a
Kubernetes Job, a compose one-shot service or the operator): the service and
``strata index`` refuse a PostgreSQL database that is behind.
"""

from __future__ import annotations

import argparse

from strata.config import Settings
from strata.stores import schema_version
from strata.stores.sql_database import SqlDatabase


def cmd_db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    db = SqlDatabase(settings.database)
    try:
        before, after = schema_version.upgrade(db.engine)
    finally:
        db.dispose()
    if before == after:
        print(f"database schema of {db.safe_url()} is at {after} (head): nothing to do")
    else:
        print(f"database schema of {db.safe_url()} upgraded from {before or 'none'} to {after}")
    return 0


def cmd_db_current(args: argparse.Namespace, settings: Settings) -> int:
    """Prints the database's version; exits 1 when it is not the one this strata needs."""
    db = SqlDatabase(settings.database)
    try:
        current = schema_version.current_revision(db.engine)
    finally:
        db.dispose()
    head = schema_version.head_revision()
    if current == head:
        print(f"{current} (head)")
        return 0
    print(f"{current or 'none'} (strata needs {head}: run `strata db upgrade`)")
    return 1
