"""Who fills the chunk cache: an indexing run writes parents through to a shared cache (Redis), which other
processes read; a process's own in-process cache is filled by its queries and its warm-up, so a run of many
files neither grows it nor evicts what the queries of a serving process use."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.config import RedisSettings
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from tests.indexing.test_large_documents import HashEncoder, _settings, many_leaves
from tests.support.documents import write_files
from tests.support.snapshots import store_state
from tests.support.stores import opened

pytestmark = pytest.mark.integration


def _docs(tmp_path: Path) -> Path:
    return write_files(tmp_path / "docs", {"a.md": many_leaves(6), "b.md": many_leaves(3, "export")})


def test_a_run_leaves_the_in_process_cache_to_queries_and_they_read_parents_from_sql(tmp_path: Path) -> None:
    settings = _settings(tmp_path / "data")  # no Redis: the in-process LRU
    with opened(settings, HashEncoder()) as resources:
        report = Indexer(resources).index_paths([_docs(tmp_path)], kb_id="kb")
        cache = resources.cached_chunks.cache
        assert (report.added, report.failed, cache.name) == (2, 0, "local")
        assert cache.keys("kb") == []  # nothing written through at indexing
        result = Retriever(resources).retrieve("export", 3, kb_ids=["kb"], rerank=False)
        state = store_state(resources, "kb")
        parents = state.sql_chunks[1] | state.sql_chunks[2]
        assert result.docs, result.meta
        assert set(cache.keys("kb")) & parents  # the query's merge read its parents from SQL and cached them


def test_a_run_writes_every_parent_through_to_redis(tmp_path: Path, redis_settings: RedisSettings) -> None:
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump())
    with opened(settings, HashEncoder()) as resources:
        report = Indexer(resources).index_paths([_docs(tmp_path)], kb_id="kb")
        state = store_state(resources, "kb")
        parents = state.sql_chunks[1] | state.sql_chunks[2]
        cached = resources.cached_chunks.cache.get_many([("kb", cid) for cid in parents])
    assert (report.added, report.failed) == (2, 0)
    assert parents and set(cached) == parents
