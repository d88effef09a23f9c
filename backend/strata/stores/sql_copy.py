"""Copying strata's SQL rows from one database to another (``strata db copy``): SQLite to PostgreSQL.

The target is brought to this strata's schema first (a fresh PostgreSQL
database has none), the source too when it is a SQLite file that is behind (as
opening it would); both must then be at this strata's head, so every table has
the same columns on either side. The target must hold no strata rows: the copy
adds, it does not merge. Leases are not copied: they belong to running
indexers. The rows move a partition at a time, in one transaction on the
target, so a failed copy leaves the target empty.
"""

from __future__ import annotations

from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

from strata.errors import StoreError
from strata.stores import schema_version
from strata.stores.sql_database import untimed
from strata.stores.sql_schema import kb_leases, metadata

_PARTITION = 500  # rows per INSERT: 500 x 14 chunk columns stays under SQLite's variable limit


def copy_database(source: Engine, target: Engine) -> dict[str, int]:
    """Copies every strata table but the leases from ``source`` into the empty ``target``; returns rows per table."""
    schema_version.open_schema(source)
    schema_version.upgrade(target)
    head = schema_version.head_revision()
    for engine in (source, target):
        current = schema_version.current_revision(engine)
        if current != head:
            raise StoreError(
                f"{_url(engine)} is at schema {current}, strata needs {head}: copy with the strata at {current}"
            )
    tables = [t for t in metadata.sorted_tables if t is not kb_leases]
    try:
        with source.connect() as src, target.begin() as dst:
            untimed(dst)
            for table in tables:
                if dst.execute(select(func.count()).select_from(table)).scalar():
                    raise StoreError(f"{_url(target)} already holds rows in {table.name}: copy into an empty database")
            copied = {}
            for table in tables:
                rows = src.execution_options(yield_per=_PARTITION).execute(table.select())
                copied[table.name] = 0
                for part in rows.partitions():
                    dst.execute(table.insert(), [dict(r._mapping) for r in part])
                    copied[table.name] += len(part)
            return copied
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot copy {_url(source)} to {_url(target)}: {exc}") from exc


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)
