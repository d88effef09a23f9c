"""One SQL database (SQLAlchemy 2; PostgreSQL or SQLite) and what every store on it shares.

``SqlDatabase`` owns the engine: its pool, SQLite's pragmas, the translation of
SQLAlchemy errors into ``StoreError``, the query path's statement timeout and,
on PostgreSQL, the client-side timeout of every call (``call_timeout_s``). A
block opened with ``connect(timeout_s=...)`` (a request's remaining deadline)
waits at most that long for anything: a pooled connection, a new one, its
ping, each statement.
The schema is ``schema_version``'s (Alembic migrations).
The parts of ``DocumentStore`` (knowledge bases, versions, chunks, term
statistics, the embedding cache, cache invalidations) are ``SqlPart``\\ s over
one ``SqlDatabase``.
"""

from __future__ import annotations

import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import QueuePool

from strata.config import DatabaseSettings
from strata.errors import LeaseLostError, StoreError
from strata.stores.call_watchdog import CallWatchdog
from strata.stores.sql_schema import kb_leases
from strata.stores.store_timeouts import REQUEST_DEADLINE, Bound, bound, timed_out

IN_BATCH = 900  # ids per IN (...) clause; far under SQLite's variable limit
INSERT_BATCH = 500  # rows per multi-row INSERT: 500 x 4 columns stays under SQLite's 32,766 variables
_UNTIMED = "strata_untimed"  # execution option: this connection's calls have no call timeout
CALL_SETTING = "STRATA_DATABASE__CALL_TIMEOUT_S"
CONNECT_SETTING = "STRATA_DATABASE__CONNECT_TIMEOUT_S"
POOL_SETTING = "STRATA_DATABASE__POOL_TIMEOUT_S"
LIBPQ_LEAST_CONNECT_S = 2  # libpq (and psycopg) raise a smaller connect_timeout to 2 s
# when the calls of this context must end (time.monotonic()): set by ``connect(timeout_s=...)`` for its block
# and the bound that set it (the request's deadline, a probe's bound)
_ENDS: ContextVar[tuple[float, str] | None] = ContextVar("strata_sql_call_ends", default=None)
_DEFAULT_CONNECT_S: float = DatabaseSettings.model_fields["connect_timeout_s"].default
_CONNECTS = threading.local()  # ``bound``: the connect timeout of this thread's last new PostgreSQL connection


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
        self.store = "PostgreSQL" if self.engine.dialect.name == "postgresql" else "SQLite"
        self._settings = settings
        self._query_timeout_ms = int(settings.query_timeout_s * 1000)
        self._fences = threading.local()
        self._watchdog: CallWatchdog[Any, Bound] | None = None
        if self.engine.dialect.name == "postgresql":
            self._watchdog = CallWatchdog(settings.call_timeout_s, _cut_if_in_call)
            _time_calls(self.engine, self._watchdog, self.call_bound)
            _time_pings(self.engine, self._watchdog, self._timed_out, self.call_bound)

    def connect(self) -> Any:
        return _translated(self.engine.connect, self, None)

    def query_path(self, timeout_s: float | None) -> Any:
        """A connection block of the query path: the statement timeout is ``query_timeout_s`` (less when
        ``timeout_s`` is), and ``timeout_s`` (a request's remaining deadline) bounds every wait of the block
        on the client too: a pooled or new connection, its ping, each statement."""
        return _translated(self.engine.connect, self, timeout_s, statement_limit=True)

    def call_bound(self) -> Bound:
        """What a call of this context may wait: the call timeout, or less when a request's deadline is nearer."""
        return bound(self._settings.call_timeout_s, CALL_SETTING, _left())

    def begin(self) -> Any:
        return _translated(self._fenced_begin, self, None)

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

    def _timed_out(self, exc: BaseException | None = None) -> StoreError | None:
        """The error of this thread's last call when a bound ended it: the call timeout (or a request's deadline)
        cut it, a new connection waited out its connect timeout, or the pool had no connection to give in time."""
        if self._watchdog is not None and self._watchdog.was_cut():
            limit = self._watchdog.why_cut() or Bound(self._watchdog.timeout_s, CALL_SETTING)
            return timed_out(self.store, "a call (strata cut the connection)", limit, address=self.safe_url())
        connecting = connect_timed_out(exc, self.safe_url())
        if connecting is not None:
            return connecting
        if isinstance(exc, PoolTimeout):
            limit = bound(self._settings.pool_timeout_s, POOL_SETTING, _left())
            return timed_out(self.store, "with a free pooled connection", limit, address=self.safe_url())
        return None

    def dispose(self) -> None:
        self.engine.dispose()


def connect_timed_out(exc: BaseException | None, address: str) -> StoreError | None:
    """The error of a new PostgreSQL connection that waited out its connect timeout (psycopg's
    ``ConnectionTimeout``, wrapped by SQLAlchemy), naming the bound this thread's last connection had;
    None for any other error. For callers that hold only the engine (the schema check)."""
    cause = getattr(exc, "orig", None)
    if cause is None or type(cause).__name__ != "ConnectionTimeout":  # psycopg.errors.ConnectionTimeout
        return None
    limit = getattr(_CONNECTS, "bound", None) or Bound(_DEFAULT_CONNECT_S, CONNECT_SETTING)
    return timed_out("PostgreSQL", "a new connection", limit, address=address)


class SqlPart:
    """A store over a shared ``SqlDatabase`` (``DocumentStore`` holds one of each over one)."""

    def __init__(self, db: SqlDatabase) -> None:
        self._db = db

    @property
    def engine(self) -> Engine:
        return self._db.engine

    def _connect(self) -> Any:
        return self._db.connect()

    def _query_path(self, timeout_s: float | None) -> Any:
        """A connection of the query path, every wait bounded by ``timeout_s`` (``SqlDatabase.query_path``)."""
        return self._db.query_path(timeout_s)

    def _begin(self) -> Any:
        return self._db.begin()


@contextmanager
def _translated(
    factory: Any, db: SqlDatabase, timeout_s: float | None, *, statement_limit: bool = False
) -> Iterator[Connection]:
    """Runs a connection block (every wait in it bounded by ``timeout_s`` when given), turning SQLAlchemy errors
    into ``StoreError`` (``StoreTimeoutError`` when a bound ended the wait)."""
    token = _ENDS.set(_ends_within(timeout_s, REQUEST_DEADLINE)) if timeout_s is not None else None
    try:
        with factory() as conn:
            if statement_limit:
                db.limit_statement_time(conn, timeout_s)
            yield conn
    except SQLAlchemyError as exc:
        raise (db._timed_out(exc) or StoreError(f"SQL store {db.safe_url()} failed: {exc}")) from exc
    finally:
        if token is not None:
            _ENDS.reset(token)


@contextmanager
def calls_within(timeout_s: float, setting: str) -> Iterator[None]:
    """Within the block, every SQL wait of this context (thread or task) ends within ``timeout_s`` (a probe's
    or a request's bound, named by ``setting`` in a timeout's error), whichever call makes it."""
    token = _ENDS.set(_ends_within(timeout_s, setting))
    try:
        yield
    finally:
        _ENDS.reset(token)


def _ends_within(timeout_s: float, setting: str) -> tuple[float, str]:
    """The end of a block given ``timeout_s``, never later than an enclosing block's."""
    ends, outer = (time.monotonic() + max(0.0, timeout_s), setting), _ENDS.get()
    return ends if outer is None or ends[0] < outer[0] else outer


def _left() -> Bound | None:
    """What is left of this context's bound, and what set it (None: no bound)."""
    ends = _ENDS.get()
    return None if ends is None else Bound(ends[0] - time.monotonic(), ends[1])


class _BoundedQueuePool(QueuePool):
    """SQLAlchemy's ``QueuePool`` whose wait for a free connection (``pool_timeout``) is cut to the remaining
    deadline of the block asking (``SqlDatabase.query_path``, ``calls_within``)."""

    @property
    def _timeout(self) -> float:
        left = _left()
        configured: float = self.__dict__["_configured_timeout"]
        return configured if left is None else max(0.0, min(configured, left.seconds))

    @_timeout.setter
    def _timeout(self, value: float) -> None:
        self.__dict__["_configured_timeout"] = value


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
    engine = create_engine(
        url,
        echo=settings.echo,
        poolclass=_BoundedQueuePool,
        pool_size=settings.pool_size,
        pool_timeout=settings.pool_timeout_s,
        pool_pre_ping=True,
        connect_args={"connect_timeout": max(LIBPQ_LEAST_CONNECT_S, math.floor(settings.connect_timeout_s))},
    )
    _bound_connects(engine, settings)
    return engine


def _bound_connects(engine: Engine, settings: DatabaseSettings) -> None:
    """Each new PostgreSQL connection's connect_timeout: the setting, or what is left of the block's bound (a
    request's deadline, a probe's) when less; libpq's least is 2 s, so a block with less left may wait up to
    that. The bound is kept for the error of a connection that runs out of it (``connect_timed_out``)."""

    @event.listens_for(engine, "do_connect")
    def _bound_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        limit = bound(settings.connect_timeout_s, CONNECT_SETTING, _left())
        _CONNECTS.bound = limit
        cparams["connect_timeout"] = max(LIBPQ_LEAST_CONNECT_S, math.floor(limit.seconds))


def _time_calls(engine: Engine, watchdog: CallWatchdog[Any, Bound], limit: Callable[[], Bound]) -> None:
    """Arms ``watchdog`` for each call of the engine's DBAPI connections: statements, commits, rollbacks and
    the dialect's first queries on a new connection. A commit or rollback has no event after it;
    ``_cut_if_in_call`` leaves alone a connection whose call has ended. A cut connection is broken, so
    SQLAlchemy invalidates it and the pool never hands it out again. Each call waits at most ``limit()``."""

    def arm(dbapi_conn: Any) -> None:
        call = limit()
        watchdog.arm(dbapi_conn, call.seconds, call)

    def timed(conn: Connection) -> bool:
        return not (conn.closed or conn.invalidated or conn.get_execution_options().get(_UNTIMED))

    @event.listens_for(engine, "before_cursor_execute")
    def _statement(conn: Connection, cursor: Any, *_: Any) -> None:
        if timed(conn):
            arm(cursor.connection)

    @event.listens_for(engine, "after_cursor_execute")
    def _statement_done(_conn: Connection, cursor: Any, *_: Any) -> None:
        watchdog.disarm(cursor.connection)

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _transaction_end(conn: Connection) -> None:
        if timed(conn):
            arm(conn.connection.dbapi_connection)

    @event.listens_for(engine, "connect", insert=True)  # before the dialect's own listeners and their queries
    @event.listens_for(engine, "reset")  # the pool's rollback of a connection returned mid-transaction
    def _pool_call(dbapi_conn: Any, *_: Any) -> None:
        if dbapi_conn is not None:
            arm(dbapi_conn)

    @event.listens_for(engine, "checkout")
    @event.listens_for(engine, "checkin")
    @event.listens_for(engine, "close")
    def _pool_idle(dbapi_conn: Any, *_: Any) -> None:
        if dbapi_conn is not None:
            watchdog.disarm(dbapi_conn)


def _time_pings(
    engine: Engine,
    watchdog: CallWatchdog[Any, Bound],
    timed_out: Callable[[], StoreError | None],
    limit: Callable[[], Bound],
) -> None:
    """Arms ``watchdog`` for the pool's pre-ping, which runs before the ``checkout`` event and has no event of
    its own. A cut ping fails its checkout with the timeout's error."""
    ping = engine.dialect.do_ping

    def timed_ping(dbapi_conn: Any) -> bool:
        call = limit()
        watchdog.arm(dbapi_conn, call.seconds, call)
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
