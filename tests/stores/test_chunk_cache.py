"""The chunk cache contract: in-process LRU and real Redis."""

from __future__ import annotations

import pytest
import redis

from strata.config import RedisSettings
from strata.errors import CacheError
from strata.stores.chunk_cache import ChunkCache, LocalChunkCache, RedisChunkCache
from strata.types import Chunk


def chunk(kb: str, cid: str, text: str = "父块文本") -> Chunk:
    return Chunk(
        cid,
        kb,
        "d.md",
        1,
        2,
        "root",
        "root",
        0,
        text,
        "A > B",
        0,
        len(text),
        child_count=3,
        metadata={"skill_points": ["x"]},
    )


@pytest.fixture(params=["local", "redis"])
def cache(request: pytest.FixtureRequest) -> ChunkCache:
    if request.param == "local":
        return LocalChunkCache(100)
    return RedisChunkCache(request.getfixturevalue("redis_settings"))


def test_round_trip_is_exact_and_namespaced_by_kb(cache) -> None:
    items = [chunk("kb1", f"c{i}", f"文本 {i}") for i in range(5)] + [chunk("kb2", "c0", "other kb")]
    cache.put_many(items)
    found = cache.get_many([("kb1", "c0"), ("kb1", "c3"), ("kb1", "nope")])
    assert found == {"c0": items[0], "c3": items[3]}
    assert cache.get_many([("kb2", "c0")])["c0"].text == "other kb"
    cache.delete_many([("kb1", "c0")])
    assert cache.get_many([("kb1", "c0")]) == {}
    assert cache.delete_kb("kb1") == 4
    assert cache.get_many([("kb1", "c3")]) == {} and cache.get_many([("kb2", "c0")])


def test_local_cache_evicts_least_recently_used() -> None:
    cache = LocalChunkCache(2)
    cache.put_many([chunk("k", "a"), chunk("k", "b")])
    cache.get_many([("k", "a")])
    cache.put_many([chunk("k", "c")])
    assert set(cache.get_many([("k", "a"), ("k", "b"), ("k", "c")])) == {"a", "c"}


def test_redis_keys_have_prefix_and_ttl(redis_settings: RedisSettings) -> None:
    settings = redis_settings.model_copy(update={"ttl_s": 120})
    cache = RedisChunkCache(settings)
    cache.put_many([chunk("kb", "c1")])
    client = redis.Redis.from_url(str(settings.url))
    key = f"{settings.key_prefix}:kb:chunk:c1"
    assert client.exists(key) and 0 < client.ttl(key) <= 120


def test_redis_down_raises_cache_error_quickly(private_redis) -> None:
    cache = RedisChunkCache(RedisSettings(url=private_redis.url))
    cache.put_many([chunk("kb", "c1")])
    private_redis.stop()
    with pytest.raises(CacheError, match="MGET"):
        cache.get_many([("kb", "c1")])


def test_deleting_a_kb_with_glob_characters_leaves_other_kbs(redis_settings: RedisSettings) -> None:
    cache = RedisChunkCache(redis_settings)
    cache.put_many([chunk("a*", "c1"), chunk("ab", "c1"), chunk("a?", "c1")])
    assert cache.delete_kb("a*") == 1
    assert cache.get_many([("ab", "c1")]) and cache.get_many([("a?", "c1")])
