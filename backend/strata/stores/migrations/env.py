"""Alembic's entry for strata's migrations: runs on the connection ``strata.stores.schema`` hands it.

Only strata's own tables (``strata_*``) are compared and migrated, so strata can
share a database with other applications; its version is kept in
``strata_alembic_version`` for the same reason. Every step applied or undone
updates ``strata_schema_compat`` (``schema_compat``): the marks an older
strata reads to know whether it may run on this schema.
"""

from __future__ import annotations

from typing import Any

from alembic import context

from strata.stores.schema_compat import COMPAT_TABLE, record_step
from strata.stores.sql_schema import metadata

VERSION_TABLE = "strata_alembic_version"


def include_name(name: str | None, type_: str, _parent_names: Any) -> bool:
    """Only strata's tables: another application's tables in the database are none of strata's business."""
    return type_ != "table" or bool(name and name.startswith("strata_") and name not in (VERSION_TABLE, COMPAT_TABLE))


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "strata's migrations run through `strata db upgrade` (strata.stores.schema), not alembic's CLI"
        )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        include_name=include_name,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters a table by copying it
        compare_type=True,
        on_version_apply=record_step,  # type: ignore[arg-type]  # alembic calls it with keyword arguments
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
