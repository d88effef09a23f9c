"""The SQL schema's migrations (Alembic) on a real PostgreSQL, and SQLite's self-upgrade.

A database made by the baseline keeps its rows through `strata db upgrade`; the
migrations' head equals the tables of ``sql_schema`` (a model change without a
migration fails here); a PostgreSQL database that is behind stops `strata serve`
and `strata index` with one line; a database an earlier strata made with
``create_all`` (no version table) is taken over at the baseline with its rows.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, insert, inspect, select, text

from strata.config import DatabaseSettings
from strata.errors import StoreError
from strata.stores import schema_version
from strata.stores.sql import DocumentStore
from strata.stores.sql_schema import chunks, documents, knowledge_bases
from tests.support.processes import run_strata, strata_env
from tests.support.stores import fresh_pg_database

pytestmark = pytest.mark.integration  # stores opened in the tests' bodies

MIGRATIONS = Path(schema_version.__file__).parent / "migrations" / "versions"


def _baseline_module():  # noqa: ANN202 - the migration module, for its frozen tables
    spec = importlib.util.spec_from_file_location("strata_baseline_0001", MIGRATIONS / "0001_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_rows(url: str) -> None:
    """A kb, a document and a chunk, written as plain rows (what any revision since the baseline holds)."""
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
                text="kept text",
                heading_path="A",
                char_start=0,
                char_end=9,
                child_count=0,
                metadata={},
            )
        )
    engine.dispose()


def _assert_rows_kept(url: str) -> None:
    store = DocumentStore(DatabaseSettings(url=url))
    try:
        assert [(kb.kb_id, kb.generation) for kb in store.list_kbs()] == [("kb", 3)]
        (version,) = store.versions("kb")
        assert (version.doc_id, version.status, version.root, dict(version.metadata)) == (
            "a.md",
            "active",
            "/docs",
            {"module": "m"},
        )
        assert store.get_chunks(["c1"])["c1"].text == "kept text"
    finally:
        store.dispose()


@pytest.mark.slow
def test_a_baseline_database_keeps_its_rows_through_db_upgrade(tmp_path: Path) -> None:
    with fresh_pg_database(migrate=False) as url:
        engine = create_engine(url)
        with engine.begin() as conn:
            command.upgrade(schema_version.alembic_config(conn), "0001")
        engine.dispose()
        _write_rows(url)

        done = run_strata(["db", "upgrade"], strata_env(tmp_path, STRATA_DATABASE__URL=url))
        assert done.returncode == 0, done.stderr

        assert schema_version.current_revision(create_engine(url)) == schema_version.head_revision()
        _assert_rows_kept(url)
        again = run_strata(["db", "upgrade"], strata_env(tmp_path, STRATA_DATABASE__URL=url))
        assert again.returncode == 0 and "nothing to do" in again.stdout


def test_db_upgrade_keeps_only_each_kbs_own_cached_vectors() -> None:
    """0002: the shared embedding cache becomes per kb; a vector no kb's leaf has is dropped, not guessed."""
    own, plain, stranger = (hashlib.sha256(t.encode()).hexdigest() for t in ("A\nkept text", "kept text", "not ours"))
    with fresh_pg_database(migrate=False) as url:
        engine = create_engine(url)
        with engine.begin() as conn:
            command.upgrade(schema_version.alembic_config(conn), "0001")
        _write_rows(url)  # kb "kb" (encoder "enc") with the leaf "kept text" under the heading "A"
        shared = _baseline_module()._baseline().tables["strata_embedding_cache"]
        cached = [("enc", own), ("enc", plain), ("enc", stranger), ("other-encoder", own)]
        with engine.begin() as conn:
            conn.execute(insert(shared), [{"encoder": e, "text_hash": h, "vector": bytes(16)} for e, h in cached])
            command.upgrade(schema_version.alembic_config(conn), "head")
        assert "strata_embedding_cache" not in inspect(engine).get_table_names()
        engine.dispose()
        store = DocumentStore(DatabaseSettings(url=url))
        try:
            assert set(store.cached_embeddings("kb", "enc", [own, plain, stranger])) == {own, plain}
            assert store.cached_embeddings("kb", "other-encoder", [own]) == {}
        finally:
            store.dispose()


@pytest.mark.parametrize("dialect", ["postgresql", "sqlite"])
def test_the_migrations_head_is_the_schema_of_the_models(dialect: str, tmp_path: Path) -> None:
    """`alembic check`: a change to sql_schema without a migration fails here, naming the difference."""
    with fresh_pg_database(migrate=False) as pg:
        url = pg if dialect == "postgresql" else f"sqlite:///{tmp_path / 'm.sqlite3'}"
        engine = create_engine(url)
        with engine.begin() as conn:
            command.upgrade(schema_version.alembic_config(conn), "head")
        with engine.connect() as conn:
            command.check(schema_version.alembic_config(conn))  # raises AutogenerateDiffsDetected on a difference
        engine.dispose()


@pytest.mark.slow
def test_a_database_behind_stops_serve_and_index_with_one_line(tmp_path: Path) -> None:
    with fresh_pg_database(migrate=False) as url:
        env = strata_env(tmp_path / "data", STRATA_DATABASE__URL=url)
        head = schema_version.head_revision()
        expected = f"database schema is at none, strata needs {head}: run `strata db upgrade`"

        for args in (["serve"], ["index", str(tmp_path), "--kb", "kb"]):
            done = run_strata(args, env, timeout=120)
            assert done.returncode == 1, (args, done.stdout, done.stderr)
            assert done.stderr.strip().endswith(expected) and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert inspect(create_engine(url)).get_table_names() == []  # nothing was created behind the operator's back

        current = run_strata(["db", "current"], env)
        assert current.returncode == 1 and f"strata needs {head}" in current.stdout


@pytest.mark.slow
def test_a_database_from_before_migrations_is_taken_over_at_the_baseline(tmp_path: Path) -> None:
    """An earlier strata's create_all (no version table), even one from before the ``root`` column."""
    with fresh_pg_database(migrate=False) as url:
        engine = create_engine(url)
        _baseline_module()._baseline().create_all(engine)  # the tables an earlier strata created at start
        with engine.begin() as conn:
            conn.execute(text("ALTER TABLE strata_documents DROP COLUMN root"))
        _write_rows_without_root(engine)
        with pytest.raises(StoreError, match="database schema is at none"):
            DocumentStore(DatabaseSettings(url=url))

        done = run_strata(["db", "upgrade"], strata_env(tmp_path, STRATA_DATABASE__URL=url))
        assert done.returncode == 0, done.stderr
        assert "upgraded from none to" in done.stdout

        with engine.connect() as conn:
            assert (
                conn.execute(text("SELECT version_num FROM strata_alembic_version")).scalar()
                == schema_version.head_revision()
            )
            assert conn.execute(select(documents.c.root)).scalar() is None  # the column is back, the row kept
        with engine.connect() as conn:
            command.check(schema_version.alembic_config(conn))
        engine.dispose()
        store = DocumentStore(DatabaseSettings(url=url))
        assert [kb.kb_id for kb in store.list_kbs()] == ["kb"] and store.get_chunks(["c1"])["c1"].text == "kept text"
        store.dispose()


def _write_rows_without_root(engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO strata_knowledge_bases (kb_id, encoder, dim, chunking, generation) "
                "VALUES ('kb', 'enc', 4, 'c', 0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO strata_chunks (chunk_id, kb_id, doc_id, version, level, root_id, ordinal, text, "
                "heading_path, char_start, char_end, child_count, metadata) VALUES ('c1', 'kb', 'a.md', 1, 3, "
                "'c1', 0, 'kept text', 'A', 0, 9, 0, '{}')"
            )
        )


def test_sqlite_upgrades_itself_on_open(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'embedded.sqlite3'}"
    store = DocumentStore(DatabaseSettings(url=url))
    store.ensure_kb("kb", encoder="enc", dim=4, chunking="c")
    store.dispose()
    assert schema_version.current_revision(create_engine(url)) == schema_version.head_revision()
