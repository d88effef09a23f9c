"""One SQL database (SQLAlchemy 2; PostgreSQL or SQLite) and what every store on it shares.

``SqlDatabase`` owns the engine: its pool, SQLite's pragmas, the translation of
SQLAlchemy errors into ``StoreError``, the query path's statement timeout and,
on PostgreSQL, the client-side timeout of every call (``call_timeout_s``).
The schema is ``schema_version``'s (Alembic migrations).
The parts of ``DocumentStore`` (knowledge bases, versions, chunks, term
statistics, the embedding cache, cache invalidations) are ``SqlPart``\\ s over
one ``SqlDatabase``.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from strata.config import DatabaseSettings
from strata.errors import LeaseLostError, StoreError
from strata.stores.call_watchdog import CallWatchdog
from strata.stores.sql_schema import kb_leases

IN_BATCH = 900  # ids per IN (...) clause; far under SQLite's variable limit
INSERT_BATCH = 500  # rows per multi-row INSERT: 500 x 4 columns stays under SQLite's 32,766 variables
_UNTIMED = "strata_untimed"  # execution option: this connection's calls have no call timeout


class SqlDatabase:
    """The engine of one database, with connections whose errors are ``StoreError``.

    A thread that holds a kb's indexing lease fences its writes (``fenced``): every transaction it begins
    first reads the lease row, locked until the transaction ends (``FOR UPDATE``; SQLite has one writer at a
    time anyway), and refuses to go on when another holder took the lease (``LeaseLostError``). A writer
    paused past its lease (a stopped process, a long GC, a stalled database) therefore cannot write over the
    run that took the kb: its next transaction fails and writes nothing.

    On PostgreSQL no call waits longer than ``call_timeout_s`` (``_time_calls``, ``_time_pings``): a server that
    stops answering without closing its sockets (paused, frozen) would otherwise hang the caller for good, and a
    lease held by a hung run lapses without a word. A late call's connection is cut and the call fails with
    ``StoreError``.
    """

    def __init__(self, settings: DatabaseSettings) -> None:
        self.engine = _create_engine(settings)
        self._query_timeout_ms = int(settings.query_timeout_s * 1000)
        self._fences = threading.local()
        self._watchdog: CallWatchdog[Any] | None = None
        if self.engine.dialect.name == "postgresql":
            self._watchdog = CallWatchdog(settings.call_timeout_s, _cut_if_in_call)
            _time_calls(self.engine, self._watchdog)
            _time_pings(self.engine, self._watchdog, self._timed_out)

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
            value = value.astimezone(UTC).replace(tzinfo=None)
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
            limit_ms = (
                self._query_timeout_ms if timeout_s is None else min(self._query_timeout_ms, int(timeout_s * 1000))
            )
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, limit_ms)}")

    def safe_url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    def _timed_out(self) -> StoreError | None:
        """The error of this thread's last call when the call timeout cut it."""
        if self._watchdog is None or not self._watchdog.was_cut():
            return None
        return StoreError(
            f"SQL store {self.safe_url()} did not answer a call within {self._watchdog.timeout_s:g} s, so strata cut "
            "the connection (database.call_timeout_s, STRATA_DATABASE__CALL_TIMEOUT_S): "
            "is the server paused or overloaded?"
        )

    def dispose(self) -> None:
        self.engine.dispose()


class SqlPart:
    """A store over a shared ``SqlDatabase`` (``DocumentStore`` holds one of each over one)."""

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
        raise (db._timed_out() or StoreError(f"SQL store {db.safe_url()} failed: {exc}")) from exc


def untimed(conn: Connection) -> Connection:
    """``conn`` without the call timeout: a migration may rightly rewrite a large table for longer, or wait
    on another upgrader's lock."""
    return conn.execution_options(**{_UNTIMED: True})


def _hold_fence(conn: Connection, kb_id: str, owner: str) -> None:
    """Locks the lease row of ``kb_id`` for this transaction; ``LeaseLostError`` when ``owner`` no longer holds it."""
    holder = conn.execute(select(kb_leases.c.owner).where(kb_leases.c.kb_id == kb_id).with_for_update()).scalar()
    if holder != owner:
        taken = f"it was taken by {holder}" if holder else "it was released or expired and taken since"
        raise LeaseLostError(
            f"this run lost the indexing lease of knowledge base {kb_id!r} ({taken}): it stopped before its next "
            "write, and nothing it left unfinished serves; the run that holds the kb now decides what it serves",
            kb_id=kb_id,
        )


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


def _time_calls(engine: Engine, watchdog: CallWatchdog[Any]) -> None:
    """Arms ``watchdog`` for each call of the engine's DBAPI connections: statements, commits, rollbacks and
    the dialect's first queries on a new connection. A commit or rollback has no event after it;
    ``_cut_if_in_call`` leaves alone a connection whose call has ended. A cut connection is broken, so
    SQLAlchemy invalidates it and the pool never hands it out again."""

    def timed(conn: Connection) -> bool:
        return not (conn.closed or conn.invalidated or conn.get_execution_options().get(_UNTIMED))

    @event.listens_for(engine, "before_cursor_execute")
    def _statement(conn: Connection, cursor: Any, *_: Any) -> None:
        if timed(conn):
            watchdog.arm(cursor.connection)

    @event.listens_for(engine, "after_cursor_execute")
    def _statement_done(_conn: Connection, cursor: Any, *_: Any) -> None:
        watchdog.disarm(cursor.connection)

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _transaction_end(conn: Connection) -> None:
        if timed(conn):
            watchdog.arm(conn.connection.dbapi_connection)

    @event.listens_for(engine, "connect", insert=True)  # before the dialect's own listeners and their queries
    @event.listens_for(engine, "reset")  # the pool's rollback of a connection returned mid-transaction
    def _pool_call(dbapi_conn: Any, *_: Any) -> None:
        if dbapi_conn is not None:
            watchdog.arm(dbapi_conn)

    @event.listens_for(engine, "checkout")
    @event.listens_for(engine, "checkin")
    @event.listens_for(engine, "close")
    def _pool_idle(dbapi_conn: Any, *_: Any) -> None:
        if dbapi_conn is not None:
            watchdog.disarm(dbapi_conn)


def _time_pings(engine: Engine, watchdog: CallWatchdog[Any], timed_out: Callable[[], StoreError | None]) -> None:
    """Arms ``watchdog`` for the pool's pre-ping, which runs before the ``checkout`` event and has no event of
    its own. A cut ping fails its checkout with the timeout's error."""
    ping = engine.dialect.do_ping

    def timed_ping(dbapi_conn: Any) -> bool:
        watchdog.arm(dbapi_conn)
        try:
            return ping(dbapi_conn)
        except Exception as exc:
            error = timed_out()  # not a failed ping, on which the pool would wait for a new connection as well
            if error is not None:
                raise error from exc
            raise
        finally:
            watchdog.disarm(dbapi_conn)

    engine.dialect.do_ping = timed_ping  # type: ignore[method-assign, assignment]


def _cut_if_in_call(dbapi_conn: Any) -> bool:
    """Shuts down the socket of a psycopg connection that libpq says is in a call (the call fails at once)."""
    from psycopg.pq import TransactionStatus

    if dbapi_conn.info.transaction_status != TransactionStatus.ACTIVE:
        return False
    # a duplicate of the descriptor: closing it leaves libpq's own, while the shutdown acts on the socket
    with socket.socket(fileno=os.dup(dbapi_conn.fileno())) as sock:
        sock.shutdown(socket.SHUT_RDWR)
    return True


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
