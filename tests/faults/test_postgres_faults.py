"""Fault matrix, PostgreSQL: stopped with a warm cache and with a cold one, paused, restarted between requests.

A private PostgreSQL cluster takes the faults (``private_postgres``). With a
warm parent cache a long-lived process answers from it and from the last
serving state it saw (``serving_state_stale``); a process that never saw a
state fails (the service answers 503) without waiting on anything; a restart
between requests costs no request (the pool pings a connection before use).
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy import event

from strata.api import create_app
from strata.config import Settings
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.types import RetrievalResult
from tests.support.documents import RESET_QUERY
from tests.support.retrieval import texts
from tests.support.servers import PrivatePostgres
from tests.support.stores import with_sections

UNCACHED_QUERY = "How do I filter search results by tag?"


def assert_clean(result: RetrievalResult) -> None:
    assert (result.meta.status, result.meta.mode, result.meta.degraded) == ("ok", "hybrid", ()), result.meta.errors
    assert result.docs and result.meta.errors == ()


def test_stopped_with_a_warm_cache_answers_from_the_cache_and_the_last_state(
    demo_kb: Settings, memo_encoder: Any, private_postgres: PrivatePostgres
) -> None:
    service = Retriever(Resources(demo_kb, encoder=memo_encoder))
    assert_clean(service.retrieve(RESET_QUERY, 5, kb_ids=["demo"]))
    warm = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(warm)
    assert warm.meta.parent_cache["hits"] > 0 and warm.meta.parent_cache["misses"] == 0

    private_postgres.stop()
    down = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert texts(down) == texts(warm) and down.meta.parent_cache == warm.meta.parent_cache
    assert (down.meta.status, down.meta.mode, down.meta.degraded) == ("degraded", "hybrid", ("serving_state_stale",))
    assert [e.stage for e in down.meta.errors] == ["state"] and "last state" in down.meta.errors[0].message
    # parents that were never cached cannot be fetched: the leaves are served unmerged, and it says so
    uncached = service.retrieve(UNCACHED_QUERY, 5, kb_ids=["demo"])
    assert uncached.docs and uncached.meta.status == "degraded"
    assert set(uncached.meta.degraded) <= {"serving_state_stale", "parent_fetch_failed"}
    assert "serving_state_stale" in uncached.meta.degraded

    private_postgres.start()
    assert_clean(service.retrieve(RESET_QUERY, 5, kb_ids=["demo"]))


def test_stopped_with_a_cold_cache_fails_at_once_and_the_service_answers_503(
    demo_kb: Settings, memo_encoder: Any, private_postgres: PrivatePostgres
) -> None:
    resources = Resources(demo_kb, encoder=memo_encoder)
    _ = resources.leaf_index
    private_postgres.stop()
    result = Retriever(resources).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert result.docs == () and (result.meta.status, result.meta.mode) == ("failed", "failed")
    assert result.meta.degraded == ("serving_state_unavailable",)
    assert "Connection refused" in result.meta.errors[0].message  # refused, not waited for

    with TestClient(create_app(demo_kb, resources=resources, warm_up=False), raise_server_exceptions=False) as client:
        response = client.post("/retrieve", json={"query": RESET_QUERY, "top_k": 5, "kb_ids": ["demo"]})
        ready = client.get("/ready")
    assert response.status_code == 503 and response.headers["content-type"].startswith("application/problem+json")
    meta = response.json()["meta"]
    assert (meta["status"], meta["degraded"]) == ("failed", ["serving_state_unavailable"])
    assert ready.status_code == 200 and ready.json()["status"] == "degraded"  # SQL is shared: the pod stays reachable
    assert ready.json()["components"]["sql"]["status"] == "down"


def test_paused_with_a_cold_cache_fails_after_the_connect_timeout(
    demo_kb: Settings, memo_encoder: Any, private_postgres: PrivatePostgres
) -> None:
    settings = with_sections(demo_kb, database={"connect_timeout_s": 1.0})
    resources = Resources(settings, encoder=memo_encoder)
    _ = resources.leaf_index
    private_postgres.pause()  # the kernel accepts the connection; nobody answers it
    try:
        result = Retriever(resources).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    finally:
        private_postgres.resume()
    assert result.docs == () and (result.meta.status, result.meta.degraded) == (
        "failed",
        ("serving_state_unavailable",),
    )
    assert "timeout" in result.meta.errors[0].message.lower(), result.meta.errors


def test_restarted_between_requests_fails_no_request(
    demo_kb: Settings, memo_encoder: Any, private_postgres: PrivatePostgres
) -> None:
    settings = with_sections(demo_kb, redis={"url": None})  # every parent read goes to SQL
    resources = Resources(settings, encoder=memo_encoder)
    service = Retriever(resources)
    queries = [RESET_QUERY, UNCACHED_QUERY, "How are backups restored?"]
    before = [service.retrieve(q, 5, kb_ids=["demo"]) for q in queries]
    for result in before:
        assert_clean(result)
    invalidated: list[object] = []
    event.listen(resources.documents.engine, "invalidate", lambda *args: invalidated.append(args))

    private_postgres.restart()  # closes the pooled connections from the server side
    after = [service.retrieve(q, 5, kb_ids=["demo"]) for q in queries]

    for result, earlier in zip(after, before):
        assert_clean(result)
        assert texts(result) == texts(earlier)
    assert invalidated, "the pooled connection was found dead and replaced (pre-ping), not handed to a query"
