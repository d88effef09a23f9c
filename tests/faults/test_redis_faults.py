"""Fault matrix, Redis: killed, paused (SIGSTOP) and restarted while a process keeps answering.

Parents come from SQL while Redis is gone (a killed Redis refuses at once, a
paused one costs one socket timeout, after which the cache is bypassed), and
from the cache again once Redis is back; ``*_cache_unavailable`` shows only
while it is down. A private ``redis-server`` takes the faults.
"""

from __future__ import annotations

from typing import Any

from strata.config import Settings
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.stores.chunk_reads import CachedChunks
from strata.types import RetrievalResult
from tests.support.documents import RESET_QUERY
from tests.support.processes import wait_for
from tests.support.retrieval import texts
from tests.support.stores import with_sections

OTHER_QUERY = "How do I filter search results by tag?"
THIRD_QUERY = "How are backups restored?"
BYPASS_S = 0.3  # how long the engine skips a cache after an error (shortened from the defaults)


def service_on(settings: Settings, encoder: Any, *, retry_after_s: float = BYPASS_S) -> tuple[Retriever, CachedChunks]:
    """A long-lived Retriever whose chunk cache and query cache skip a failed Redis for ``retry_after_s``."""
    resources = Resources(with_sections(settings, redis={"retry_after_s": retry_after_s}), encoder=encoder)
    return Retriever(resources), resources.cached_chunks


def assert_clean(result: RetrievalResult) -> None:
    assert (result.meta.status, result.meta.mode, result.meta.degraded) == ("ok", "hybrid", ()), result.meta.errors
    assert result.docs and result.meta.errors == ()


def wait_for_the_bypass_to_end(service: Retriever) -> None:
    """Redis is tried again once the breaker's ``retry_after_s`` has run out."""
    assert wait_for(lambda: not service.resources.redis_breaker.is_open, within_s=BYPASS_S + 30)


def cache_errors(result: RetrievalResult, stage: str) -> list[str]:
    return [e.message for e in result.meta.errors if e.stage == stage]


def test_redis_killed_then_restarted(demo_kb: Settings, memo_encoder: Any, private_redis: Any) -> None:
    settings = with_sections(demo_kb, redis={"url": private_redis.url})
    service, parents = service_on(settings, memo_encoder)
    cold = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(cold)
    warm = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(warm)
    assert warm.meta.parent_cache["hits"] > 0 and warm.meta.parent_cache["misses"] == 0

    private_redis.stop()
    down = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert texts(down) == texts(warm), "parents from SQL give the same answer"
    assert (down.meta.status, down.meta.mode, down.meta.degraded) == (
        "degraded",
        "hybrid",
        ("parent_cache_unavailable",),
    )
    assert down.meta.parent_cache == {
        "hits": 0,
        "misses": warm.meta.parent_cache["hits"],
        "leaf_hits": 0,
        "leaf_misses": warm.meta.parent_cache["leaf_hits"],
    }
    assert any("Connection refused" in m or "Error 111" in m for m in cache_errors(down, "parent_cache"))
    assert parents.cache_errors == 1

    private_redis.start()  # same port, empty
    wait_for_the_bypass_to_end(service)
    refilled = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(refilled)
    assert refilled.meta.parent_cache["misses"] > 0  # the restarted Redis was empty: SQL, then backfill
    cached = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(cached)
    assert cached.meta.parent_cache == {
        "hits": warm.meta.parent_cache["hits"],
        "misses": 0,
        "leaf_hits": warm.meta.parent_cache["leaf_hits"],
        "leaf_misses": 0,
    }
    assert texts(cached) == texts(warm) and parents.cache_errors == 1


def test_redis_paused_costs_one_socket_timeout_then_is_bypassed(
    demo_kb: Settings, memo_encoder: Any, private_redis: Any
) -> None:
    settings = with_sections(demo_kb, redis={"url": private_redis.url, "socket_timeout_s": 0.3})
    service, parents = service_on(settings, memo_encoder)
    assert_clean(service.retrieve(RESET_QUERY, 5, kb_ids=["demo"]))
    warm = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(warm)

    private_redis.pause()
    try:
        timed_out = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
        bypassed = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    finally:
        private_redis.resume()
    for result in (timed_out, bypassed):
        assert texts(result) == texts(warm)
        assert (result.meta.status, result.meta.degraded) == ("degraded", ("parent_cache_unavailable",))
        assert result.meta.parent_cache["hits"] == 0
    assert any("Timeout" in m for m in cache_errors(timed_out, "parent_cache")), timed_out.meta.errors
    assert any("bypassed" in m for m in cache_errors(bypassed, "parent_cache")), bypassed.meta.errors
    assert parents.cache_errors == 1, "only the first request waited for the socket timeout"

    wait_for_the_bypass_to_end(service)
    back = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(back)
    assert back.meta.parent_cache == warm.meta.parent_cache  # the entries written before the pause serve again


def test_query_cache_unavailable_only_while_redis_is(demo_kb: Settings, memo_encoder: Any, private_redis: Any) -> None:
    settings = with_sections(demo_kb, redis={"url": private_redis.url}, retrieval={"cache_size": 64})
    service, _ = service_on(settings, memo_encoder)
    first = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    again = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert (first.meta.cache, again.meta.cache) == ("miss", "hit")
    for result in (first, again):
        assert (result.meta.status, result.meta.degraded) == ("ok", ())

    private_redis.stop()
    down = service.retrieve(OTHER_QUERY, 5, kb_ids=["demo"])  # not in this process's own LRU: Redis is asked
    assert down.docs and down.meta.status == "degraded" and down.meta.cache == "miss"
    assert set(down.meta.degraded) == {"query_cache_unavailable", "parent_cache_unavailable"}
    assert cache_errors(down, "query_cache")
    assert service.retrieve(RESET_QUERY, 5, kb_ids=["demo"]).meta.cache == "hit"  # the in-process LRU still answers

    private_redis.start()
    wait_for_the_bypass_to_end(service)
    computed = service.retrieve(THIRD_QUERY, 5, kb_ids=["demo"])
    other_process, _ = service_on(settings, memo_encoder)  # an empty in-process LRU: only Redis can answer it
    shared = other_process.retrieve(THIRD_QUERY, 5, kb_ids=["demo"])
    assert (computed.meta.cache, shared.meta.cache) == ("miss", "hit")
    for result in (computed, shared):
        assert (result.meta.status, result.meta.degraded, result.meta.errors) == ("ok", (), ())
    assert texts(shared) == texts(computed) and shared.docs


def test_a_redis_outage_opens_the_one_breaker_for_both_users(
    demo_kb: Settings, memo_encoder: Any, private_redis: Any
) -> None:
    settings = with_sections(demo_kb, redis={"url": private_redis.url}, retrieval={"cache_size": 64})
    service, parents = service_on(settings, memo_encoder, retry_after_s=60)
    assert_clean(service.retrieve(RESET_QUERY, 5, kb_ids=["demo"]))
    other_service, other_parents = service_on(settings, memo_encoder, retry_after_s=60)

    private_redis.stop()
    try:
        down = service.retrieve(OTHER_QUERY, 5, kb_ids=["demo"])  # the query cache meets the outage first
        fetch = other_parents.get_many([("demo", "no-such-chunk")])  # here the parent store does
        other_down = other_service.retrieve(OTHER_QUERY, 5, kb_ids=["demo"])
    finally:
        private_redis.start()
    assert any("Connection refused" in m or "Error 111" in m for m in cache_errors(down, "query_cache"))
    assert any("bypassed" in m for m in cache_errors(down, "parent_cache")), down.meta.errors
    assert parents.cache_errors == 0, "the parent store skipped Redis without trying it"
    assert fetch.cache_error and "bypassed" not in fetch.cache_error and other_parents.cache_errors == 1
    assert any("bypassed" in m for m in cache_errors(other_down, "query_cache")), other_down.meta.errors
