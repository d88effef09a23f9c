"""One SQL database (SQLAlchemy 2; PostgreSQL or SQLite) and what every store on it shares.

``SqlDatabase`` owns the engine: its pool, SQLite's pragmas, the translation of
SQLAlchemy errors into ``StoreError`` and the query path's statement timeout.
The schema is ``schema_version``'s (Alembic migrations).
The stores of ``DocumentStore`` (knowledge bases, versions, chunks, term
statistics, the embedding cache) are ``SqlPart``\\ s over one ``SqlDatabase``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from strata.config import DatabaseSettings
from strata.errors import LeaseLostError, StoreError
from strata.stores.sql_schema import kb_leases

IN_BATCH = 900  # ids per IN (...) clause; far under SQLite's variable limit
INSERT_BATCH = 500  # rows per multi-row INSERT: 500 x 4 columns stays under SQLite's 32,766 variables


class SqlDatabase:
    """The engine of one database, with connections whose errors are ``StoreError``.

    A thread that holds a kb's indexing lease fences its writes (``fenced``): every transaction it begins
    first reads the lease row, locked until the transaction ends (``FOR UPDATE``; SQLite has one writer at a
    time anyway), and refuses to go on when another holder took the lease (``LeaseLostError``). A writer
    paused past its lease (a stopped process, a long GC, a stalled database) therefore cannot write over the
    run that took the kb: its next transaction fails and writes nothing.
    """

    def __init__(self, settings: DatabaseSettings) -> None:
        self.engine = _create_engine(settings)
        self._query_timeout_ms = int(settings.query_timeout_s * 1000)
        self._fences = threading.local()

    def connect(self) -> Any:
        return _translated(self.engine.connect, self)

    def begin(self) -> Any:
        return _translated(self._fenced_begin, self)

    @contextmanager
    def fenced(self, kb_id: str, owner: str) -> Iterator[None]:
        """Within the block, this thread's transactions go on only while ``owner`` holds ``kb_id``'s lease."""
        fences = self._thread_fences()
        fences.append((kb_id, owner))
        try:
            yield
        finally:
            fences.remove((kb_id, owner))

    def now(self) -> datetime:
        """The database's clock (naive UTC): leases expire by it, so a writer whose own clock runs ahead or
        behind cannot take a lease early or keep one late."""
        with self.connect() as conn:
            value = conn.execute(select(func.current_timestamp())).scalar()
        if isinstance(value, str):  # SQLite: 'YYYY-MM-DD HH:MM:SS', UTC
            value = datetime.fromisoformat(value)
        if value.tzinfo is not None:
            value = value.astimezone(timezone.utc).replace(tzinfo=None)
        return value

    def check_fences(self) -> None:
        """Raises ``LeaseLostError`` when this thread's fenced leases were taken (before a write to Milvus)."""
        if self._thread_fences():
            with self.begin():
                pass

    @contextmanager
    def _fenced_begin(self) -> Iterator[Connection]:
        with self.engine.begin() as conn:
            for kb_id, owner in self._thread_fences():
                _hold_fence(conn, kb_id, owner)
            yield conn

    def _thread_fences(self) -> list[tuple[str, str]]:
        if not hasattr(self._fences, "held"):
            self._fences.held = []
        return self._fences.held

    def insert(self, table: Any) -> Any:
        """The dialect's INSERT (with ``on_conflict_do_nothing``)."""
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(table)

    def limit_statement_time(self, conn: Connection, timeout_s: float | None = None) -> None:
        """A hung PostgreSQL costs the query path at most the query timeout (or ``timeout_s``), not forever."""
        if self.engine.dialect.name == "postgresql":
            limit_ms = self._query_timeout_ms if timeout_s is None else min(self._query_timeout_ms, int(timeout_s * 1000))
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, limit_ms)}")

    def safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def dispose(self) -> None:
        self.engine.dispose()


class SqlPart:
    """A store over a shared ``SqlDatabase`` (``DocumentStore`` is all of them over one)."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    @property
    def engine(self) -> Engine:
        return self._db.engine

    @engine.setter
    def engine(self, engine: Engine) -> None:
        self._db.engine = engine

    def _connect(self) -> Any:
        return self._db.connect()

    def _begin(self) -> Any:
        return self._db.begin()


@contextmanager
def _translated(factory: Any, db: SqlDatabase) -> Iterator[Connection]:
    """Runs a connection block, turning SQLAlchemy errors into ``StoreError``."""
    try:
        with factory() as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise StoreError(f"SQL store {db.safe_url()} failed: {exc}") from exc


def _hold_fence(conn: Connection, kb_id: str, owner: str) -> None:
    """Locks the lease row of ``kb_id`` for this transaction; ``LeaseLostError`` when ``owner`` no longer holds it."""
    holder = conn.execute(
        select(kb_leases.c.owner).where(kb_leases.c.kb_id == kb_id).with_for_update()
    ).scalar()  # fmt: skip
    if holder != owner:
        taken = f"it was taken by {holder}" if holder else "it was released or expired and taken since"
        raise LeaseLostError(
            f"this run lost the indexing lease of knowledge base {kb_id!r} ({taken}): it stopped before its next "
            "write, and nothing it left unfinished serves; the run that holds the kb now decides what it serves",
            kb_id=kb_id,
        )  # fmt: skip


def _create_engine(settings: DatabaseSettings) -> Engine:
    url = str(settings.url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, echo=settings.echo, connect_args={"timeout": settings.connect_timeout_s * 6})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        echo=settings.echo,
        pool_size=settings.pool_size,
        pool_pre_ping=True,
        connect_args={"connect_timeout": max(1, int(settings.connect_timeout_s))},
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
