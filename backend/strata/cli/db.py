"""``strata db upgrade|current|downgrade|wait|copy``: the SQL schema's version (``strata.stores.schema_version``).

Run ``strata db upgrade`` once per release, before the new pods start (a
Kubernetes Job, a compose one-shot service or the operator): the service and
``strata index`` refuse a PostgreSQL database that is behind. ``strata db
wait`` is what a pod's init container runs: it returns once the schema is one
this strata runs on. ``strata db downgrade`` takes the schema back for a
rollback the compatibility marks do not cover.
"""

from __future__ import annotations

import argparse
import sys
import time

from strata.config import DatabaseSettings, Settings
from strata.errors import StoreError
from strata.stores import schema_version
from strata.stores.sql_copy import copy_database
from strata.stores.sql_database import SqlDatabase


def cmd_db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    db = SqlDatabase(settings.database)
    try:
        before, after = schema_version.upgrade(db.engine)
    finally:
        db.dispose()
    head = schema_version.head_revision()
    if before == after:
        state = "head" if after == head else f"newer than this strata ({head}) and compatible with it"
        print(f"database schema of {db.safe_url()} is at {after} ({state}): nothing to do")
    else:
        print(f"database schema of {db.safe_url()} upgraded from {before or 'none'} to {after}")
    return 0


def cmd_db_current(args: argparse.Namespace, settings: Settings) -> int:
    """Prints the database's version; exits 1 when this strata cannot run on it."""
    db = SqlDatabase(settings.database)
    try:
        current = schema_version.current_revision(db.engine)
        refusal = _schema_state(db)
    finally:
        db.dispose()
    head = schema_version.head_revision()
    if current == head:
        print(f"{current} (head)")
    elif refusal is None:
        print(f"{current} (newer than this strata's {head} and marked compatible with it)")
    elif current is not None and not schema_version.knows(current):
        print(f"{current} (newer than this strata's {head} and not compatible with it)")
    else:
        print(f"{current or 'none'} (strata needs {head}: run `strata db upgrade`)")
    return 0 if refusal is None else 1


def cmd_db_downgrade(args: argparse.Namespace, settings: Settings) -> int:
    db = SqlDatabase(settings.database)
    try:
        before, after = schema_version.downgrade(db.engine, args.revision, force=args.force)
    finally:
        db.dispose()
    if before == after:
        print(f"database schema of {db.safe_url()} is at {after}: nothing to do")
    else:
        print(f"database schema of {db.safe_url()} downgraded from {before} to {after or 'none'}")
    return 0


def cmd_db_wait(args: argparse.Namespace, settings: Settings) -> int:
    """Returns 0 once the schema is one this strata runs on; 1 after ``--timeout`` seconds (one line each way).

    An unreachable database is "not yet", like one that is behind; a line is printed only when the state changes.
    """
    deadline = time.monotonic() + args.timeout
    db = SqlDatabase(settings.database)
    try:
        return _wait(db, deadline, args)
    finally:
        db.dispose()


def _wait(db: SqlDatabase, deadline: float, args: argparse.Namespace) -> int:
    said = ""
    while True:
        state = _schema_state(db)
        if state is None:
            current = schema_version.current_revision(db.engine)
            print(f"database schema is at {current}: strata {schema_version.head_revision()} runs on it", flush=True)
            return 0
        if state != said:
            print(f"waiting: {state}", flush=True)
            said = state
        if time.monotonic() >= deadline:
            print(f"strata db wait: timed out after {args.timeout:g} s: {state}", file=sys.stderr)
            return 1
        time.sleep(min(args.interval, max(0.0, deadline - time.monotonic())))


def _schema_state(db: SqlDatabase) -> str | None:
    """None when this strata can run on the database; else why not, on one line."""
    try:
        schema_version.check_schema(db.engine)
        return None
    except StoreError as exc:
        return str(exc).splitlines()[0]


def cmd_db_copy(args: argparse.Namespace, settings: Settings) -> int:
    """Copies the strata rows of ``--from`` into the configured (empty) database, upgrading it first."""
    source, target = SqlDatabase(DatabaseSettings(url=args.source)), SqlDatabase(settings.database)
    try:
        copied = copy_database(source.engine, target.engine)
    finally:
        source.dispose()
        target.dispose()
    for table, rows in copied.items():
        print(f"{table}: {rows} rows")
    print(f"copied {source.safe_url()} into {target.safe_url()} (schema {schema_version.head_revision()})")
    return 0
