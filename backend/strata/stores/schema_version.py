"""The SQL schema's version (Alembic): where a database is, and bringing it to what this strata needs.

The migrations live in ``strata/stores/migrations`` (one per schema change; the
first, ``0001``, is the schema strata had before it kept a version). A
PostgreSQL database is upgraded once per release by ``strata db upgrade`` (a
Job or the operator, before new pods start); every process that opens it only
checks the version and refuses to start when it is behind, so replicas never
race on DDL and need no DDL rights. An embedded SQLite database upgrades itself
on open, under a file lock, so the zero-setup path stays zero-setup.

A database an earlier strata created (its tables, no version table) is taken
over by the baseline migration, which creates only what is missing and records
the version: its rows stay.
"""

from __future__ import annotations

import fcntl
import functools
import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from strata.config import DatabaseSettings
from strata.errors import StoreError
from strata.stores.sql_database import SqlDatabase, untimed

logger = logging.getLogger(__name__)

VERSION_TABLE = "strata_alembic_version"
_SCRIPTS = "strata.stores:migrations"
_PG_LOCK_KEY = 0x5354524154  # pg_advisory_xact_lock key ("STRAT"): one upgrader at a time


def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for strata's migrations, running on ``connection``."""
    config = Config()
    config.set_main_option("script_location", _SCRIPTS)
    config.attributes["connection"] = connection
    return config


@functools.cache
def head_revision() -> str:
    """The schema version this strata needs."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "strata ships at least the baseline migration"
    return head


def current_revision(engine: Engine) -> str | None:
    """The database's schema version; None for an empty database or one from before migrations."""
    try:
        with engine.connect() as conn:
            return _current(conn)
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read the schema version of {_safe_url(engine)}: {exc}") from exc


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Brings the database to the head revision; returns (version before, version after).

    Upgraders queue on a lock (PostgreSQL advisory lock, SQLite file lock), so two at once are safe. The
    call timeout does not apply (``untimed``).
    """
    try:
        with _upgrade_lock(engine), engine.begin() as conn:
            untimed(conn)
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            before = _current(conn)
            if before != head_revision():
                command.upgrade(alembic_config(conn), "head")
            return before, _current(conn) or ""
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot upgrade the SQL schema of {_safe_url(engine)}: {exc}") from exc


def check_schema(engine: Engine) -> None:
    """Refuses (``StoreError``, one line) a database that is not at the version this strata needs."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return
    known = {script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if current is not None and current not in known:
        raise StoreError(
            f"database schema is at {current}, newer than this strata knows (it needs {head}): "
            "a newer strata upgraded it; run that version"
        )
    raise StoreError(f"database schema is at {current or 'none'}, strata needs {head}: run `strata db upgrade`")


def open_schema(engine: Engine) -> None:
    """What a process does on open: SQLite upgrades itself, PostgreSQL must be at head already."""
    if engine.dialect.name == "sqlite":
        if current_revision(engine) != head_revision():
            before, after = upgrade(engine)
            if before != after:
                logger.info("upgraded the SQLite schema from %s to %s", before or "none", after)
        return
    check_schema(engine)


def open_database_schema(settings: DatabaseSettings) -> None:
    """``open_schema`` on the configured database, before a command starts its work (or its workers)."""
    db = SqlDatabase(settings)
    try:
        open_schema(db.engine)
    finally:
        db.dispose()


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


@contextmanager
def _upgrade_lock(engine: Engine) -> Iterator[None]:
    """A file lock beside a SQLite database (PostgreSQL locks inside the transaction instead)."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    if not path or path == ":memory:":
        yield
        return
    with open(Path(f"{path}.migrate.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _safe_url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)
