"""Nothing stale: a delete while Redis is paused never lets the deleted text answer again, on real
PostgreSQL, Redis (a private ``redis-server`` the test pauses) and Milvus Lite.

Version numbers of a document never repeat, deletes included, so the chunk ids of a document indexed
again differ from the deleted one's; the failed cache invalidation is recorded in SQL, reported by
``reconcile``, and retried by the next run or ``reconcile --repair``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from tests.support.documents import write_files
from tests.support.retrieval import texts
from tests.support.snapshots import redis_chunk_ids
from tests.support.stores import make_settings, opened

QUESTION = "How long are records kept?"


def retention(days: int) -> dict[str, str]:
    return {"retention.md": f"# Retention\n\nRecords are kept for exactly {days} days, then erased.\n"}


def delete_while_redis_paused(
    tmp_path: Path, pg_url: str, encoder: Any, private_redis: Any, kb: str
) -> tuple[Settings, Path, set[str]]:
    """retention.md (30 days) indexed into ``kb`` and queried (its chunks in Redis), then deleted while
    Redis is paused; returns the settings, the folder and the deleted chunk ids, Redis running again."""
    docs = write_files(tmp_path / "docs", retention(30))
    settings = make_settings(
        tmp_path / "data", pg_url, redis_url=private_redis.url, redis={"socket_timeout_s": 0.3, "retry_after_s": 0.2}
    )
    with opened(settings, encoder) as resources:
        assert Indexer(resources).index_paths([docs], kb_id=kb).added == 1
        first = Retriever(resources).retrieve(QUESTION, 3, kb_ids=[kb], strategy="hybrid")
        assert any("30 days" in t for t in texts(first)), first.meta
        old_ids = {c.chunk_id for c in resources.documents.chunks.version_chunks(kb, "retention.md", 1)}
    assert old_ids <= redis_chunk_ids(settings, kb), "the query left the chunks in Redis"
    with opened(settings, encoder) as resources:
        private_redis.pause()
        try:
            assert Indexer(resources).delete_document(kb, "retention.md") is True
        finally:
            private_redis.resume()
    return settings, docs, old_ids


def test_a_document_deleted_while_redis_is_paused_never_answers_again(
    tmp_path: Path, module_pg_url: str, memo_encoder: Any, private_redis: Any
) -> None:
    settings, docs, old_ids = delete_while_redis_paused(tmp_path, module_pg_url, memo_encoder, private_redis, "rr")

    write_files(docs, retention(90))
    with opened(settings, memo_encoder) as resources:
        assert Indexer(resources).index_paths([docs], kb_id="rr").added == 1
        answer = Retriever(resources).retrieve(QUESTION, 3, kb_ids=["rr"], strategy="hybrid")
        versions = [v.version for v in resources.documents.versions.of_kb("rr", "retention.md")]
        new_ids = {c.chunk_id for c in resources.documents.chunks.version_chunks("rr", "retention.md", versions[-1])}
        report = Indexer(resources).reconcile("rr")
    assert any("90 days" in t for t in texts(answer)) and not any("30 days" in t for t in texts(answer)), texts(answer)
    assert versions == [2] and not new_ids & old_ids, "a version number is never given twice, even after a delete"
    assert not old_ids & redis_chunk_ids(settings, "rr"), "the index run retried the recorded invalidations"
    assert (report.invalidations_pending, report.stale_cache, report.differences) == (0, 0, 0), report


def test_reconcile_repair_retries_a_failed_cache_invalidation(
    tmp_path: Path, module_pg_url: str, memo_encoder: Any, private_redis: Any
) -> None:
    settings, _, old_ids = delete_while_redis_paused(tmp_path, module_pg_url, memo_encoder, private_redis, "rr-repair")
    with opened(settings, memo_encoder) as resources:
        indexer = Indexer(resources)
        found = indexer.reconcile("rr-repair")
        repaired = indexer.reconcile("rr-repair", repair=True)
        after = indexer.reconcile("rr-repair")
    assert found.invalidations_pending == len(old_ids) and found.stale_cache == len(old_ids), found
    assert found.differences == 2 * len(old_ids), "reported, whatever else reconcile sees"
    assert repaired.invalidations_pending == len(old_ids) and not repaired.notes, repaired
    assert (after.invalidations_pending, after.stale_cache, after.differences) == (0, 0, 0), after
    assert not old_ids & redis_chunk_ids(settings, "rr-repair")
