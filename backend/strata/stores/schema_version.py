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

Rolling back: a process also runs on a *newer* schema when the migrations
that made it are marked compatible with its own revision (``schema_compat``),
so the previous release's pods keep serving after an upgrade. ``downgrade``
undoes steps whose ``downgrade()`` loses nothing, and lossy ones only when
forced.
"""

from __future__ import annotations

import fcntl
import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from strata.config import DatabaseSettings
from strata.errors import StoreError
from strata.stores import schema_compat
from strata.stores.sql_database import SqlDatabase, connect_timed_out, untimed

logger = logging.getLogger(__name__)

VERSION_TABLE = "strata_alembic_version"
_SCRIPTS = "strata.stores:migrations"
_PG_LOCK_KEY = 0x5354524154  # pg_advisory_xact_lock key ("STRAT"): one upgrader at a time


def alembic_config(connection: Connection | None = None, script_location: str = _SCRIPTS) -> Config:
    """Alembic's configuration for strata's migrations (or those at ``script_location``), running on ``connection``."""
    config = Config()
    config.set_main_option("script_location", script_location)
    config.attributes["connection"] = connection
    return config


@functools.cache
def migration_scripts() -> ScriptDirectory:
    """The migrations this strata ships."""
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The schema version this strata needs."""
    head = migration_scripts().get_current_head()
    assert head is not None, "strata ships at least the baseline migration"
    return head


def current_revision(engine: Engine) -> str | None:
    """The database's schema version; None for an empty database or one from before migrations."""
    try:
        with engine.connect() as conn:
            return _current(conn)
    except SQLAlchemyError as exc:
        raise (
            connect_timed_out(exc, _safe_url(engine))
            or StoreError(f"cannot read the schema version of {_safe_url(engine)}: {exc}")
        ) from exc


def upgrade(engine: Engine) -> tuple[str | None, str]:
    """Brings the database to the head revision; returns (version before, version after).

    A newer schema marked compatible with this strata is left as it is (before == after, not the head); an
    incompatible one is refused like ``check_schema`` refuses it.

    Upgraders queue on a lock (PostgreSQL advisory lock, SQLite file lock), so two at once are safe. The
    call timeout does not apply (``untimed``).
    """
    with _migrating(engine, "upgrade") as conn:
        before = _current(conn)
        if before is not None and _newer(migration_scripts(), before):  # an older release's Job after a newer one
            _accept_newer(engine, conn, migration_scripts(), before)
            return before, before
        if before != head_revision():
            command.upgrade(alembic_config(conn), "head")
        return before, _current(conn) or ""


def downgrade(engine: Engine, target: str | None = None, *, force: bool = False) -> tuple[str | None, str | None]:
    """Takes the database back to ``target`` (default: one step); returns (version before, version after).

    Refuses (``StoreError``, one line) a schema this strata does not know, a target that is not behind the
    database, and, unless ``force``, a step whose downgrade loses rows (its ``lossy_downgrade``). Same lock
    as ``upgrade``.
    """
    scripts = migration_scripts()
    with _migrating(engine, "downgrade") as conn:
        current = _current(conn)
        if current is None:
            raise StoreError("database schema is at none: nothing to downgrade")
        chain = _chain(scripts, head_revision())
        if current not in chain:
            raise StoreError(
                f"database schema is at {current}, newer than this strata knows: run the downgrade "
                "with the strata that upgraded it"
            )
        target = target or (chain[current] or "base")
        undone = _steps_down(chain, current, target)
        if not undone:
            return current, current
        lossy = [
            f"{r} {schema_compat.lossy_downgrade(scripts, r)}"
            for r in undone
            if schema_compat.lossy_downgrade(scripts, r)
        ]
        if lossy and not force:
            raise StoreError(
                f"downgrading {current} to {target} loses data ({'; '.join(lossy)}): take a backup, then pass --force"
            )
        command.downgrade(alembic_config(conn), target)
        return current, _current(conn)


def check_schema(engine: Engine, scripts: ScriptDirectory | None = None) -> None:
    """Refuses (``StoreError``, one line) a database this strata cannot run on.

    It runs on its own head, and on a newer head whose recorded steps are all marked compatible with it
    (``schema_compat.refusal``; a warning is logged). ``scripts`` are the migrations the code knows (default:
    the ones it ships; a test passes fewer to be an older strata).
    """
    scripts = scripts or migration_scripts()
    try:
        with engine.connect() as conn:
            current = _current(conn)
            if current is not None and _newer(scripts, current):
                _accept_newer(engine, conn, scripts, current)
                return
    except SQLAlchemyError as exc:
        raise (
            connect_timed_out(exc, _safe_url(engine))
            or StoreError(f"cannot read the schema version of {_safe_url(engine)}: {exc}")
        ) from exc
    head = scripts.get_current_head()
    if current != head:
        raise StoreError(f"database schema is at {current or 'none'}, strata needs {head}: run `strata db upgrade`")


def _newer(scripts: ScriptDirectory, current: str) -> bool:
    """Whether ``current`` is a revision the code does not know (a newer strata's)."""
    head = scripts.get_current_head()
    assert head is not None, "strata ships at least the baseline migration"
    return current not in _chain(scripts, head)


def _accept_newer(engine: Engine, conn: Connection, scripts: ScriptDirectory, current: str) -> None:
    """Logs a warning once when the newer schema's recorded marks accept this code; else ``StoreError``."""
    head = scripts.get_current_head() or ""
    reason = schema_compat.refusal(schema_compat.recorded_steps(conn), current, head, set(_chain(scripts, head)))
    if reason is not None:
        raise StoreError(
            f"database schema is at {current}, newer than this strata ({head}) and not compatible with it ({reason}): "
            f"run the strata that upgraded it, or `strata db downgrade {head}` with it"
        )
    _warn_newer(_safe_url(engine), current, head)


def open_schema(engine: Engine) -> None:
    """What a process does on open: SQLite upgrades itself, PostgreSQL must be at head already."""
    if engine.dialect.name == "sqlite" and _behind(current_revision(engine)):
        before, after = upgrade(engine)
        if before != after:
            logger.info("upgraded the SQLite schema from %s to %s", before or "none", after)
        return
    check_schema(engine)  # a newer SQLite schema runs only when marked compatible, as on PostgreSQL


def open_database_schema(settings: DatabaseSettings) -> None:
    """``open_schema`` on the configured database, before a command starts its work (or its workers)."""
    db = SqlDatabase(settings)
    try:
        open_schema(db.engine)
    finally:
        db.dispose()


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def knows(revision: str) -> bool:
    """Whether ``revision`` is this strata's head or older (not a newer strata's)."""
    return revision in _chain(migration_scripts(), head_revision())


def _behind(current: str | None) -> bool:
    return current is None or (current != head_revision() and knows(current))


def _chain(scripts: ScriptDirectory, head: str) -> dict[str, str | None]:
    """``head`` and its ancestors among ``scripts``, each with its parent (None for the baseline)."""
    chain: dict[str, str | None] = {}
    for script in scripts.iterate_revisions(head, "base"):
        chain[script.revision] = script.down_revision  # type: ignore[assignment]  # one parent: no merges
    return chain


def _steps_down(chain: dict[str, str | None], current: str, target: str) -> list[str]:
    """The revisions a downgrade from ``current`` to ``target`` ("base" for none) undoes, newest first."""
    undone: list[str] = []
    revision: str | None = current
    while revision != (None if target == "base" else target):
        if revision is None:
            raise StoreError(
                f"cannot downgrade to {target}: the database is at {current} and {target} is not behind it"
            )
        undone.append(revision)
        revision = chain[revision]
    return undone


@functools.cache  # once per process and database
def _warn_newer(url: str, current: str, head: str) -> None:
    logger.warning(
        "database schema of %s is at %s, newer than this strata (%s); its migrations are marked "
        "compatible with %s, so this strata runs on it",
        url,
        current,
        head,
        head,
    )


@contextmanager
def _migrating(engine: Engine, what: str) -> Iterator[Connection]:
    """A transaction for DDL, holding the upgrade lock (file lock beside SQLite, advisory lock on PostgreSQL)."""
    try:
        with _upgrade_lock(engine), engine.begin() as conn:
            untimed(conn)
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})
            yield conn
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot {what} the SQL schema of {_safe_url(engine)}: {exc}") from exc


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
