"""The query-result cache: LRU with TTL, single-flight misses, and Redis shared between processes."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from strata.config import RedisSettings
from strata.rag.query_cache import Lookup, QueryCache, cache_key, normalize_query
from tests.support.processes import free_port


class Compute:
    """A ``compute`` callable that counts its calls and returns ``(value, cacheable)``."""

    def __init__(self, value: dict[str, Any], *, cacheable: bool = True, sleep_s: float = 0.0) -> None:
        self.value, self.cacheable, self.sleep_s = value, cacheable, sleep_s
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self) -> tuple[dict[str, Any], bool]:
        with self._lock:
            self.calls += 1
        time.sleep(self.sleep_s)
        return self.value, self.cacheable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    """A clock for the cache's entries (``timer=clock.monotonic``), moved by hand."""
    return Clock()


def result(name: str) -> dict[str, Any]:
    return {"docs": [{"content": f"evidence for {name}", "score": 0.5}], "meta": {"status": "ok", "query": name}}


def ask(cache: QueryCache, key: str) -> bool:
    """Looks ``key`` up, computing ``result(key)`` on a miss; whether it was a hit."""
    compute = Compute(result(key))
    found = cache.get_or_compute(key, compute)
    assert found.value == result(key)
    hit = found.source == "hit"
    assert compute.calls == (0 if hit else 1)
    return hit


def never() -> tuple[dict[str, Any], bool]:
    raise AssertionError("compute ran although the result was cached")


# -- keys ---------------------------------------------------------------------


def test_normalize_query_folds_width_case_and_whitespace() -> None:
    assert normalize_query("  ＭＩＬＶＵＳ\u3000Hybrid \t\n SEARCH ") == "milvus hybrid search"
    assert normalize_query("ﬁle  Ⅳ") == "file iv"
    assert normalize_query("向量 检索") == normalize_query("向量\u3000 检索 ")


def test_cache_key_ignores_key_order_and_changes_with_the_generation() -> None:
    parts = {"q": "milvus", "top_k": 5, "kbs": ["a", "b"], "gen": [["a", 3], ["b", 1]], "filters": {"x": 1, "y": 2}}
    reordered = {"filters": {"y": 2, "x": 1}, "gen": [["a", 3], ["b", 1]], "kbs": ["a", "b"], "top_k": 5, "q": "milvus"}
    bumped = {**parts, "gen": [["a", 4], ["b", 1]]}

    assert cache_key(parts) == cache_key(reordered)
    assert cache_key(parts) != cache_key(bumped)
    assert cache_key(parts) != cache_key({**parts, "top_k": 6})


# -- in-process LRU -------------------------------------------------------------


def test_a_computed_result_is_a_hit_the_second_time() -> None:
    cache = QueryCache(size=8, ttl_s=60)

    assert cache.get_or_compute("k", Compute(result("k"))) == Lookup(result("k"), "miss")
    assert cache.get_or_compute("k", never) == Lookup(result("k"), "hit")


def test_an_entry_expires_after_its_ttl(clock: Clock) -> None:
    cache = QueryCache(size=8, ttl_s=10, timer=clock.monotonic)
    ask(cache, "k")

    clock.now += 9.9
    assert ask(cache, "k") is True
    clock.now += 0.1
    assert ask(cache, "k") is False


def test_the_least_recently_used_entry_is_evicted_at_size() -> None:
    cache = QueryCache(size=2, ttl_s=60)
    ask(cache, "a")
    ask(cache, "b")
    ask(cache, "a")  # a is now more recent than b
    ask(cache, "c")  # evicts b

    assert ask(cache, "a") is True
    assert ask(cache, "c") is True
    assert ask(cache, "b") is False


def test_a_non_cacheable_result_is_returned_but_not_stored() -> None:
    cache = QueryCache(size=8, ttl_s=60)
    degraded = Compute({"meta": {"status": "degraded"}}, cacheable=False)

    assert cache.get_or_compute("k", degraded) == Lookup({"meta": {"status": "degraded"}}, "miss")
    assert cache.get_or_compute("k", degraded) == Lookup({"meta": {"status": "degraded"}}, "miss")
    assert degraded.calls == 2


def test_a_failing_compute_raises_and_the_next_caller_computes_again() -> None:
    cache = QueryCache(size=8, ttl_s=60)

    def boom() -> tuple[dict[str, Any], bool]:
        raise RuntimeError("search down")

    with pytest.raises(RuntimeError, match="search down"):
        cache.get_or_compute("k", boom)
    assert ask(cache, "k") is False


def test_a_cleared_cache_misses() -> None:
    cache = QueryCache(size=8, ttl_s=60)
    ask(cache, "k")

    cache.clear()

    assert ask(cache, "k") is False


def test_size_zero_means_disabled() -> None:
    assert QueryCache(size=0, ttl_s=60).enabled is False
    assert QueryCache(size=1, ttl_s=60).enabled is True


# -- single flight --------------------------------------------------------------


def run_together(threads: int, call: Any) -> list[Any]:
    """Starts ``threads`` threads that call ``call()`` at the same moment; their results in thread order."""
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads

    def worker(n: int) -> None:
        barrier.wait(timeout=5)
        results[n] = call()

    workers = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=10)
    assert not any(w.is_alive() for w in workers), "a thread is stuck"
    return results


def test_concurrent_identical_misses_compute_once() -> None:
    cache = QueryCache(size=8, ttl_s=60)
    compute = Compute(result("k"), sleep_s=0.2)

    answers = run_together(8, lambda: cache.get_or_compute("k", compute))

    assert compute.calls == 1
    assert [a.value for a in answers] == [result("k")] * 8
    assert sorted(a.source for a in answers) == ["miss"] + ["shared"] * 7


def test_concurrent_misses_share_a_non_cacheable_result_but_do_not_store_it() -> None:
    """During an outage identical queries wait for the one in flight instead of recomputing one after another."""
    cache = QueryCache(size=8, ttl_s=60)
    degraded = Compute({"meta": {"status": "failed"}}, cacheable=False, sleep_s=0.3)

    answers = run_together(4, lambda: cache.get_or_compute("k", degraded))

    assert degraded.calls == 1
    assert sorted(a.source for a in answers) == ["miss", "shared", "shared", "shared"]
    assert cache.get_or_compute("k", degraded).source == "miss"  # not stored: the next query computes
    assert degraded.calls == 2


def test_a_call_waits_for_an_identical_one_in_flight_no_longer_than_its_own_deadline() -> None:
    """A query with little time left computes itself rather than wait out a slower identical query's run."""
    cache = QueryCache(size=8, ttl_s=60)
    started, release = threading.Event(), threading.Event()
    leader_answer: list[Lookup] = []

    def slow() -> tuple[dict[str, Any], bool]:
        started.set()
        assert release.wait(timeout=10), "the test never released the first call"
        return result("first"), True

    leader = threading.Thread(target=lambda: leader_answer.append(cache.get_or_compute("k", slow)))
    leader.start()
    assert started.wait(timeout=30)
    own = Compute(result("second"))
    follower = cache.get_or_compute("k", own, wait_s=0.0)  # no time left to wait: the first is still running
    release.set()
    leader.join(timeout=30)

    assert follower == Lookup(result("second"), "miss") and own.calls == 1
    assert leader_answer == [Lookup(result("first"), "miss")]


def test_hits_are_copies_a_caller_cannot_corrupt_the_cache() -> None:
    cache = QueryCache(size=8, ttl_s=60)
    first = cache.get_or_compute("k", Compute(result("k"))).value
    first["docs"][0]["content"] = "edited by the caller"

    hit = cache.get_or_compute("k", never).value
    hit["docs"].clear()

    assert cache.get_or_compute("k", never).value == result("k")


# -- Redis ------------------------------------------------------------------------


@pytest.fixture
def redis_client(redis_settings: RedisSettings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(str(redis_settings.url))
    yield client
    client.close()


def keys_under(client: redis.Redis, settings: RedisSettings) -> list[bytes]:
    return list(client.scan_iter(match=f"{settings.key_prefix}:*"))


def test_a_fresh_cache_gets_the_result_from_redis(redis_settings: RedisSettings) -> None:
    value = {
        "docs": [{"content": "向量检索 — hybrid", "score": 0.25, "metadata": {"level": 2}}],
        "meta": {"status": "ok"},
    }
    QueryCache(size=8, ttl_s=60, redis_settings=redis_settings).get_or_compute("k", Compute(value))

    fresh = QueryCache(size=8, ttl_s=60, redis_settings=redis_settings)

    assert fresh.get_or_compute("k", never) == Lookup(value, "hit")


def test_redis_entries_expire_with_the_ttl(redis_settings: RedisSettings, redis_client: redis.Redis) -> None:
    QueryCache(size=8, ttl_s=60, redis_settings=redis_settings).get_or_compute("k", Compute(result("k")))

    [key] = keys_under(redis_client, redis_settings)
    assert 0 < redis_client.ttl(key) <= 60


def test_a_non_cacheable_result_is_not_written_to_redis(
    redis_settings: RedisSettings, redis_client: redis.Redis
) -> None:
    degraded = Compute({"meta": {"status": "degraded"}}, cacheable=False)
    QueryCache(size=8, ttl_s=60, redis_settings=redis_settings).get_or_compute("k", degraded)

    assert keys_under(redis_client, redis_settings) == []
    assert ask(QueryCache(size=8, ttl_s=60, redis_settings=redis_settings), "k") is False


def test_results_read_from_redis_respect_the_local_size(
    redis_settings: RedisSettings, redis_client: redis.Redis
) -> None:
    writer = QueryCache(size=8, ttl_s=60, redis_settings=redis_settings)
    ask(writer, "a")
    ask(writer, "b")
    reader = QueryCache(size=1, ttl_s=60, redis_settings=redis_settings)
    assert (ask(reader, "a"), ask(reader, "b")) == (True, True)  # both from Redis

    redis_client.delete(*keys_under(redis_client, redis_settings))

    assert ask(reader, "b") is True  # the one entry the reader keeps
    assert ask(reader, "a") is False  # evicted when b came in


def test_an_unreachable_redis_falls_back_to_the_local_cache(caplog: pytest.LogCaptureFixture) -> None:
    settings = RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0", key_prefix="strata-test-down")
    cache = QueryCache(size=8, ttl_s=60, redis_settings=settings)

    with caplog.at_level(logging.WARNING, logger="strata.rag.query_cache"):
        first = cache.get_or_compute("k", Compute(result("k")))
        assert ask(cache, "k") is True

    assert first.source == "miss" and "Redis" in (first.cache_error or "")
    assert "Redis failed" in caplog.text


class CountingStore:
    """Wraps the cache's Redis store and counts the calls that reach it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def get(self, key: str) -> Any:
        self.calls += 1
        return self.inner.get(key)

    def set(self, key: str, blob: str, *, ttl_s: int) -> None:
        self.calls += 1
        self.inner.set(key, blob, ttl_s=ttl_s)

    def close(self) -> None:
        self.inner.close()


def test_a_paused_redis_costs_one_timeout_then_is_bypassed(private_redis) -> None:
    settings = RedisSettings(
        url=private_redis.url, key_prefix="strata-test-paused", socket_timeout_s=0.3, retry_after_s=60
    )
    cache = QueryCache(size=8, ttl_s=60, redis_settings=settings)
    store = cache._redis = CountingStore(cache._redis)
    private_redis.pause()
    try:
        first = cache.get_or_compute("a", Compute(result("a")))
        second = cache.get_or_compute("b", Compute(result("b")))
    finally:
        private_redis.resume()

    assert "Timeout" in (first.cache_error or "")
    assert store.calls == 1  # the GET that timed out; the SET after it and every call of "b" skipped Redis
    assert "bypassed" in (second.cache_error or "")
    assert (first.value, second.value) == (result("a"), result("b"))


def test_an_entry_that_does_not_decode_is_a_miss(redis_settings: RedisSettings, redis_client: redis.Redis) -> None:
    writer = QueryCache(size=8, ttl_s=60, redis_settings=redis_settings)
    ask(writer, "garbled")
    ask(writer, "wrong-shape")
    garbled, wrong_shape = sorted(keys_under(redis_client, redis_settings))
    redis_client.set(garbled, b"\xff{not json")
    redis_client.set(wrong_shape, b'{"docs": 3}')
    reader = QueryCache(
        size=8, ttl_s=60, redis_settings=redis_settings, decodes=lambda v: isinstance(v.get("docs"), list)
    )

    assert reader.get_or_compute("garbled", Compute(result("garbled"))).source == "miss"
    assert reader.get_or_compute("wrong-shape", Compute(result("wrong-shape"))).source == "miss"
