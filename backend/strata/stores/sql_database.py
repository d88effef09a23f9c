"""One SQL database (SQLAlchemy 2; PostgreSQL or SQLite) and what every store on it shares.

``SqlDatabase`` owns the engine: its pool, SQLite's pragmas, the translation of
SQLAlchemy errors into ``StoreError`` and the query path's statement timeout.
The schema is ``schema_version``'s (Alembic migrations).
The stores of ``DocumentStore`` (knowledge bases, versions, chunks, term
statistics, the embedding cache) are ``SqlPart``\\ s over one ``SqlDatabase``.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from strata.config import DatabaseSettings
from strata.errors import StoreError

IN_BATCH = 900  # ids per IN (...) clause; far under SQLite's variable limit
INSERT_BATCH = 500  # rows per multi-row INSERT: 500 x 4 columns stays under SQLite's 32,766 variables


class SqlDatabase:
    """The engine of one database, with connections whose errors are ``StoreError``."""

    def __init__(self, settings: DatabaseSettings) -> None:
        self.engine = _create_engine(settings)
        self._query_timeout_ms = int(settings.query_timeout_s * 1000)

    def connect(self) -> Any:
        return _translated(self.engine.connect, self)

    def begin(self) -> Any:
        return _translated(self.engine.begin, self)

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
