"""What one query asks of the stores: ids from Milvus, leaf texts from the parent store, and
no SQL beyond the generation probe while nothing changes. Real Milvus Lite and SQLite/PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import event

from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from tests.support.documents import GARDEN, RESET_QUERY, write
from tests.support.paths import EXAMPLES_KB
from tests.support.processes import wait_for
from tests.support.stores import cut_sql, examples_kb, make_settings, own_db, with_parts


class Statements:
    """The SQL statements an engine runs (real ones, counted by SQLAlchemy's cursor event)."""

    def __init__(self, resources: Resources) -> None:
        self.seen: list[str] = []
        event.listen(resources.documents.engine, "before_cursor_execute", self._record)

    def _record(self, conn, cursor, statement: str, *args) -> None:
        self.seen.append(" ".join(statement.split()))

    def touching(self, table: str) -> list[str]:
        return [s for s in self.seen if table in s]


@pytest.fixture
def serving(tmp_path: Path, memo_encoder) -> Iterator[tuple[Resources, Retriever]]:
    resources = examples_kb(tmp_path, memo_encoder)
    retriever = Retriever(resources)
    yield resources, retriever
    retriever.close()


def test_leaves_come_from_sql_once_then_from_the_cache_and_match_what_was_indexed(serving) -> None:
    resources, retriever = serving
    retriever.warm_up()  # fills the in-process cache with leaves: empty it to see the first read
    resources.cached_chunks.cache.delete_kb("demo")
    first = retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False)
    again = retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False)

    assert first.meta.status == "ok" and first.docs
    assert first.meta.parent_cache["leaf_misses"] > 0
    assert again.meta.parent_cache["leaf_misses"] == 0 and again.meta.parent_cache["leaf_hits"] > 0
    assert [d.content for d in again.docs] == [d.content for d in first.docs]
    for doc in first.docs:  # every returned text is the one SQL holds for that chunk
        stored = resources.documents.chunks.get_chunks([doc.metadata["chunk_id"]])[doc.metadata["chunk_id"]]
        assert doc.content == stored.text and doc.metadata["heading_path"] == stored.heading_path


def test_the_warm_up_puts_the_chunks_in_the_in_process_cache(serving) -> None:
    resources, retriever = serving
    first = retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False)
    every = resources.documents.chunks.active_chunk_ids("demo", levels=(1, 2, 3))
    assert set(resources.cached_chunks.cache.keys("demo")) == every  # examples/kb is far under half the cache
    assert first.meta.parent_cache["leaf_misses"] == first.meta.parent_cache["misses"] == 0
    assert first.meta.parent_cache["leaf_hits"] > 0


def test_the_warm_up_fills_at_most_half_the_cache_leaves_first(tmp_path: Path, memo_encoder) -> None:
    settings = make_settings(tmp_path, own_db(tmp_path), redis_url=None, redis={"local_cache_size": 20})
    resources = Resources(settings, encoder=memo_encoder)
    Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo")
    resources.cached_chunks.cache.delete_kb("demo")  # what indexing wrote through
    Retriever(resources).warm_up()
    cached = resources.documents.chunks.get_chunks(resources.cached_chunks.cache.keys("demo"))
    assert len(cached) == 10 and {c.level for c in cached.values()} == {3}


def test_steady_state_queries_run_only_the_generation_probe(serving) -> None:
    resources, retriever = serving
    retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False)
    statements = Statements(resources)

    retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False)

    assert len(statements.seen) == 1, statements.seen
    assert "strata_knowledge_bases" in statements.seen[0] and "strata_documents" not in statements.seen[0]


def test_a_new_version_moves_the_generation_and_the_state_is_read_again(serving, tmp_path: Path, memo_encoder) -> None:
    resources, retriever = serving
    retriever.retrieve("tomatoes watering", 3, kb_ids=["demo"])
    statements = Statements(resources)

    other = Resources(resources.settings, encoder=memo_encoder)  # another writer on the same stores
    Indexer(other).index_paths([write(tmp_path / "g", "garden.md", GARDEN)], kb_id="demo")
    result = retriever.retrieve("tomatoes watering", 3, kb_ids=["demo"])

    assert statements.touching("strata_documents"), "the serving state was read again after the change"
    assert result.meta.status == "ok" and "Tomatoes" in result.docs[0].content


def test_with_sql_down_the_leaf_texts_come_from_the_leaf_index(tmp_path: Path, pg_url: str, memo_encoder) -> None:
    settings = make_settings(tmp_path, own_db(tmp_path), redis_url=None)
    resources = Resources(settings, encoder=memo_encoder)
    Indexer(resources).index_paths([write(tmp_path / "g", "garden.md", GARDEN)], kb_id="garden")
    retriever = Retriever(resources)
    assert retriever.retrieve("watering", 3, kb_ids=["garden"]).docs  # a serving state to fall back on
    resources.cached_chunks.cache.delete_kb("garden")  # nothing cached: the leaves must come from somewhere else
    cut_sql(resources)

    result = retriever.retrieve("tomatoes deep watering", 3, kb_ids=["garden"])

    assert "serving_state_stale" in result.meta.degraded
    assert result.docs and "Tomatoes" in result.docs[0].content
    assert any(e.stage == "leaf_fetch" for e in result.meta.errors)
    retriever.close()


def test_a_leaf_sql_no_longer_holds_is_left_out_and_reported(serving) -> None:
    resources, retriever = serving
    found = retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False, strategy="hybrid")
    gone = found.docs[0].metadata["chunk_id"]
    resources.cached_chunks.cache.delete_many([("demo", gone)])
    with resources.documents.engine.begin() as conn:  # an orphan: in Milvus, not in SQL
        conn.exec_driver_sql("DELETE FROM strata_chunks WHERE chunk_id = ?", (gone,))

    result = retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False, strategy="hybrid")

    assert gone not in [d.metadata["chunk_id"] for d in result.docs]
    assert any(e.error == "MissingLeaf" and gone in e.message for e in result.meta.errors)


class SlowFirstSearch:
    """The real leaf index; its first dense search waits until other queries' dense searches queue behind it."""

    def __init__(self, real) -> None:
        self._real = real
        self.batch_sizes: list[int] = []
        self.queued_dense: Callable[[], int] = lambda: 0

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._real, name)

    def search_dense_many(self, vectors, **kwargs):  # noqa: ANN201
        if not self.batch_sizes:
            wait_for(lambda: self.queued_dense() >= 2, within_s=30)  # the assertion below says if they never came
        self.batch_sizes.append(len(vectors))
        return self._real.search_dense_many(vectors, **kwargs)


def test_concurrent_queries_share_searches_and_each_gets_its_own_answer(serving) -> None:
    resources, retriever = serving
    questions = [
        RESET_QUERY,
        "如何重置密码",
        "审计日志保留多久",
        "双因素认证怎么开启",
        "会话超时",
        "API 限流",
        "登录失败锁定",
        "邮件发送地址",
    ]
    alone = {q: [d.metadata["chunk_id"] for d in retriever.retrieve(q, 3, kb_ids=["demo"]).docs] for q in questions}
    slow = SlowFirstSearch(resources.leaf_index)
    together = Retriever(with_parts(resources, leaf_index=slow))
    searches = together._routes._searches  # the search batcher's queue, read only to know when to let go
    slow.queued_dense = lambda: sum(r.key.route == "dense" for r in list(searches._queue))
    try:
        with ThreadPoolExecutor(len(questions)) as pool:
            results = list(pool.map(lambda q: together.retrieve(q, 3, kb_ids=["demo"]), questions))
    finally:
        together.close()
    assert [r.meta.status for r in results] == ["ok"] * len(questions)
    assert {q: [d.metadata["chunk_id"] for d in r.docs] for q, r in zip(questions, results)} == alone
    assert max(slow.batch_sizes) > 1 and sum(slow.batch_sizes) == len(questions)  # shared dense searches


def test_orphan_leaves_that_fill_the_candidate_list_neither_displace_served_evidence_nor_answer_ok(
    serving, memo_encoder
) -> None:
    """Leaves SQL does not serve (a lost run's late upsert, a Milvus restored from an older backup): copies of
    every served leaf under a document SQL never had, so they rank beside their originals and fill the list."""
    from dataclasses import replace

    from strata.indexing.embedding import search_text

    resources, retriever = serving
    before = retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False, strategy="hybrid")
    ids = resources.documents.chunks.active_chunk_ids("demo")
    leaves = list(resources.documents.chunks.get_chunks(ids).values())
    orphans = [replace(c, chunk_id=f"orphan-{i}", doc_id="ghost", version=9) for i, c in enumerate(leaves)]
    texts = [search_text(c, resources.settings.chunking.contextualize) for c in orphans]
    resources.leaf_index.upsert(orphans, memo_encoder.encode_passages(texts), texts)
    resources.leaf_index.flush()

    result = retriever.retrieve(RESET_QUERY, 3, kb_ids=["demo"], expand=False, strategy="hybrid")

    ids = [d.metadata["chunk_id"] for d in result.docs]
    assert ids == [d.metadata["chunk_id"] for d in before.docs], "an orphan took a served leaf's place"
    assert result.meta.status == "degraded" and "unserved_leaves" in result.meta.degraded
    assert any(e.error == "MissingLeaf" and "orphan-" in e.message for e in result.meta.errors)
