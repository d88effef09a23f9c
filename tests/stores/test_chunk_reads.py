"""Chunks read through the chunk cache, against real Redis and real SQL."""

from __future__ import annotations

import logging

import pytest
import redis
from sqlalchemy import event

from strata.config import DatabaseSettings, RedisSettings
from strata.stores.chunk_cache import LocalChunkCache, RedisChunkCache
from strata.stores.chunk_reads import CachedChunks
from strata.stores.sql import DocumentStore, DocumentVersion
from tests.support.documents import make_chunks


@pytest.fixture
def sql(database_settings: DatabaseSettings) -> DocumentStore:
    store = DocumentStore(database_settings)
    store.kbs.ensure_kb("kb", encoder="e", dim=3, chunking="c")
    for d in range(4):
        chunks = make_chunks("kb", f"doc{d}", 1, n_l2=5)
        store.versions.write_pending(DocumentVersion("kb", f"doc{d}", 1, f"doc{d}.md", "h"), chunks)
        store.versions.activate("kb", f"doc{d}", 1)
    yield store
    store.dispose()


def _parent_refs(sql: DocumentStore) -> list[tuple[str, str]]:
    parents = [c for d in range(4) for c in sql.chunks.version_chunks("kb", f"doc{d}", 1, levels=(2,))]
    assert len(parents) == 20
    return [("kb", c.chunk_id) for c in parents]


def _count_selects(sql: DocumentStore) -> list[str]:
    seen: list[str] = []
    event.listen(sql.engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


def _mget_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


def test_twenty_parents_cost_one_cache_trip_and_one_query(sql: DocumentStore, redis_settings: RedisSettings) -> None:
    store = CachedChunks(RedisChunkCache(redis_settings), sql.chunks)
    refs = _parent_refs(sql)
    client = redis.Redis.from_url(str(redis_settings.url))
    statements = _count_selects(sql)
    before = _mget_calls(client)
    first = store.get_many(refs)
    assert _mget_calls(client) - before == 1
    assert len([s for s in statements if "SELECT" in s.upper()]) == 1
    assert (first.cache_hits, first.cache_misses, first.sql_queries, first.cache_round_trips) == (0, 20, 1, 1)
    statements.clear()
    second = store.get_many(refs)
    assert (second.cache_hits, second.sql_queries) == (20, 0) and statements == []
    assert second.chunks == first.chunks and len(first.chunks) == 20


def test_same_texts_with_redis_up_stopped_and_unset(sql: DocumentStore, private_redis, caplog) -> None:
    refs = _parent_refs(sql)
    expected = {cid: c.text for cid, c in sql.chunks.get_chunks([cid for _, cid in refs]).items()}
    up = CachedChunks(RedisChunkCache(RedisSettings(url=private_redis.url)), sql.chunks)
    assert {k: c.text for k, c in up.get_many(refs).chunks.items()} == expected
    private_redis.stop()
    with caplog.at_level(logging.WARNING, logger="strata.stores.chunk_reads"):
        down = up.get_many(refs)
    assert {k: c.text for k, c in down.chunks.items()} == expected
    assert down.cache_error and "MGET" in down.cache_error and down.sql_queries == 1
    assert "serving from SQL" in caplog.text and up.cache_errors == 1
    again = up.get_many(refs)  # bypassed for a while: no second wait on a dead server
    assert again.cache_round_trips == 0 and "bypassed" in str(again.cache_error)
    unset = CachedChunks(LocalChunkCache(), sql.chunks)
    assert {k: c.text for k, c in unset.get_many(refs).chunks.items()} == expected


def test_a_paused_redis_costs_one_timeout_then_is_bypassed(sql: DocumentStore, private_redis) -> None:
    refs = _parent_refs(sql)[:5]
    store = CachedChunks(RedisChunkCache(RedisSettings(url=private_redis.url, socket_timeout_s=0.3)), sql.chunks)
    store.get_many(refs)
    private_redis.pause()
    try:
        first = store.get_many(refs)
        second = store.get_many(refs)
    finally:
        private_redis.resume()
    assert len(first.chunks) == len(second.chunks) == 5
    assert first.cache_error and "Timeout" in first.cache_error and first.cache_round_trips == 1  # one timeout
    assert second.cache_round_trips == 0 and "bypassed" in str(second.cache_error)  # then no wait at all


def test_missing_parents_are_reported(sql: DocumentStore) -> None:
    fetch = CachedChunks(LocalChunkCache(), sql.chunks).get_many([("kb", "no-such-parent")])
    assert fetch.chunks == {} and fetch.missing == ("no-such-parent",)
