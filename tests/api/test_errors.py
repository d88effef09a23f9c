"""Every error is a problem document with a request id: 401, 403, 404, 413, 422, 503 (failed retrieval, busy, stores down)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from milvus_lite.server_manager import server_manager_instance

from strata.api import create_app
from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.support.api import AppFactory, auth
from tests.support.processes import free_port
from tests.support.stores import make_settings

ADMIN = auth("admin-key")


def assert_problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert {"type", "title", "status", "detail", "request_id"} <= set(body) and body["status"] == status
    assert body["request_id"] and response.headers["x-request-id"] == body["request_id"]
    return body


@pytest.mark.parametrize(
    "headers", [{}, auth("not-a-key"), {"Authorization": "Basic YWRtaW4ta2V5"}, {"Authorization": "Bearer"}]
)
def test_every_endpoint_but_health_and_ready_needs_a_valid_key(client: TestClient, headers: dict[str, str]) -> None:
    for method, path in [
        ("GET", "/ready/detail"),
        ("GET", "/metrics"),
        ("POST", "/retrieve"),
        ("GET", "/kbs"),
        ("GET", "/kbs/demo/documents"),
        ("GET", "/kbs/demo/stats"),
        ("POST", "/retrieve/by-module"),
    ]:
        response = client.request(method, path, headers=headers, json={"query": "x", "module": "auth"})
        body = assert_problem(response, 401)
        assert response.headers["www-authenticate"].startswith("Bearer") and "Bearer" in body["detail"]
    assert client.get("/health").status_code == 200 and client.get("/ready", headers=headers).status_code == 200


def test_a_sane_request_id_is_kept_and_echoed(client: TestClient) -> None:
    response = client.post("/retrieve", json={"query": ""}, headers={**ADMIN, "X-Request-ID": "trace-42"})
    assert assert_problem(response, 422)["request_id"] == "trace-42"
    other = client.get("/kbs", headers={**ADMIN, "X-Request-ID": "bad id\twith tab"})
    assert other.headers["x-request-id"] != "bad id\twith tab" and len(other.headers["x-request-id"]) == 32


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"query": "", "top_k": 3}, "query"),
        ({"query": "   ", "top_k": 3}, "blank"),
        ({"query": "ok", "top_k": 0}, "top_k"),
        ({"query": "ok", "top_k": 51}, "top_k must be an integer from 1 to 50"),
        ({"query": "x" * 2001}, "at most 2000 characters"),
        ({"query": "bell \x07 here"}, "control character U+0007"),
        ({"query": "nul \x00"}, "control character U+0000"),
        ({"query": "ok", "filters": {"module": ["auth"]}}, "filters.module"),
        ({"query": "ok", "filters": {"modules": ["a\x1b[31m"]}}, "control character"),
        ({"query": "ok", "kb_ids": ["../etc"]}, "kb_ids"),
        ({"query": "ok", "kb_ids": []}, "kb_ids"),
        ({"query": "ok", "unknown": 1}, "unknown"),
        ({"query": "ok", "top_k": True}, "top_k"),  # each member of its own JSON type: nothing coerced
        ({"query": "ok", "top_k": "3"}, "top_k"),
        ({"query": "ok", "explain": 1}, "explain"),
        ({"query": "ok", "rerank": "false"}, "rerank"),
        ({"query": "ok", "deadline_ms": "100"}, "deadline_ms"),
        ({"query": "ok", "filters": {"modules": "auth"}}, "filters.modules"),
        ({"top_k": 3}, "query"),
    ],
)
def test_invalid_input_is_a_422(client: TestClient, body: dict[str, Any], fragment: str) -> None:
    problem = assert_problem(client.post("/retrieve", json=body, headers=ADMIN), 422)
    assert fragment in problem["detail"]


@pytest.mark.parametrize(
    ("path", "body", "fragment"),
    [
        ("/retrieve/by-module", {"module": "auth", "level": "1"}, "level"),
        ("/retrieve/by-module", {"module": "auth", "level": True}, "level"),
        ("/retrieve/by-module", {"module": "auth", "top_k": False}, "top_k"),
        ("/retrieve/by-skill", {"skill": "reset", "explain": "true"}, "explain"),
        ("/kbs", {"kb_id": 5}, "kb_id"),
    ],
)
def test_every_request_body_takes_each_member_in_its_own_type(
    client: TestClient, path: str, body: dict[str, Any], fragment: str
) -> None:
    """``true`` is no integer and ``"true"`` no boolean, as the published schema says (schemathesis sends them)."""
    problem = assert_problem(client.post(path, json=body, headers=ADMIN), 422)
    assert fragment in problem["detail"]


def test_an_integral_number_is_an_integer_as_json_schema_says(client: TestClient) -> None:
    body = {"query": "ok", "top_k": 2.0, "deadline_ms": 60000.0, "kb_ids": ["demo"]}
    assert client.post("/retrieve", json=body, headers=ADMIN).json()["meta"]["top_k"] == 2


def test_malformed_json_is_a_422(client: TestClient) -> None:
    response = client.post("/retrieve", content=b"{not json", headers={**ADMIN, "Content-Type": "application/json"})
    assert_problem(response, 422)


def test_unknown_kb_is_a_404(client: TestClient) -> None:
    problem = assert_problem(client.post("/retrieve", json={"query": "x", "kb_ids": ["nope"]}, headers=ADMIN), 404)
    assert "nope" in problem["detail"]
    assert_problem(client.get("/kbs/nope/documents", headers=ADMIN), 404)
    assert_problem(client.get("/kbs/nope/stats", headers=ADMIN), 404)
    assert_problem(client.delete("/kbs/demo/documents/nope.md", headers=ADMIN), 404)
    assert_problem(client.get("/kbs/bad%00kb/stats", headers=ADMIN), 422)


def test_a_read_only_key_cannot_write(client: TestClient) -> None:
    reader = auth("demo-reader-key")
    files = [("files", ("a.md", b"# A\n\nText.", "text/markdown"))]
    assert_problem(client.post("/kbs/demo/documents", files=files, headers=reader), 403)
    assert_problem(client.delete("/kbs/demo/documents/auth.md", headers=reader), 403)
    assert_problem(client.post("/kbs", json={"kb_id": "demo"}, headers=reader), 403)
    assert client.get("/kbs/demo/stats", headers=reader).json()["documents"] == 5  # nothing was deleted


def test_uploads_over_the_limit_are_413_also_when_chunked(make_client: AppFactory) -> None:
    small = make_client(api={"max_upload_bytes": 2048})
    big = b"# Big\n\n" + b"x" * 4096
    files = [("files", ("big.md", big, "text/markdown"))]
    problem = assert_problem(small.post("/kbs/limits/documents", files=files), 413)
    assert "2048 bytes" in problem["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the body arrives chunked
        yield b'{"query": "'
        for _ in range(8):
            yield b"y" * 512
        yield b'"}'

    chunked = small.post("/retrieve", content=chunks(), headers={"Content-Type": "application/json"})
    assert "content-length" not in {k.lower() for k in chunked.request.headers}
    assert_problem(chunked, 413)
    assert small.get("/kbs/limits/stats").status_code == 404  # the refused upload created nothing


def test_upload_names_must_stay_inside_the_upload(client: TestClient) -> None:
    files = [("files", ("../../etc/passwd.md", b"# X\n\ny", "text/markdown"))]
    assert "'..'" in assert_problem(client.post("/kbs/evil/documents", files=files, headers=ADMIN), 422)["detail"]
    twice = [("files", ("a.md", b"# A\n\n1", "text/markdown")), ("files", ("a.md", b"# A\n\n2", "text/markdown"))]
    assert "twice" in assert_problem(client.post("/kbs/evil/documents", files=twice, headers=ADMIN), 422)["detail"]


def add_hold_route(client: TestClient) -> tuple[threading.Event, threading.Event]:
    """``GET /test-hold``: takes a slot and keeps it until the test sets ``release``; ``entered`` says it runs."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> dict[str, str]:
        entered.set()
        release.wait(30)
        return {"held": "yes"}

    client.app.add_api_route("/test-hold", hold, methods=["GET"])
    return entered, release


def test_excess_requests_wait_then_get_503_with_retry_after(make_client: AppFactory) -> None:
    busy = make_client(api={"max_concurrency": 1, "queue_timeout_s": 0.0})
    entered, release = add_hold_route(busy)
    holder = threading.Thread(target=lambda: results.append(busy.get("/test-hold")))
    results: list[Any] = []
    holder.start()
    assert entered.wait(30)
    try:
        refused = busy.post("/retrieve", json={"query": "x"})
        problem = assert_problem(refused, 503)
        assert refused.headers["retry-after"] == "1" and "busy" in problem["detail"]
        assert busy.get("/health").status_code == 200  # operations endpoints are never queued
    finally:
        release.set()
        holder.join(30)
    assert results[0].status_code == 200
    assert busy.post("/retrieve", json={"query": "password", "top_k": 1}).status_code == 200  # the slot is free again
    assert 'strata_http_requests_rejected_total{reason="concurrency"} 1.0' in busy.get("/metrics").text


def test_a_queued_request_is_served_once_a_slot_frees(make_client: AppFactory) -> None:
    busy = make_client(api={"max_concurrency": 1, "queue_timeout_s": 60.0})
    entered, release = add_hold_route(busy)
    answers: dict[str, Any] = {}
    holder = threading.Thread(target=lambda: answers.update(hold=busy.get("/test-hold")))
    holder.start()
    assert entered.wait(30)
    waiter = threading.Thread(
        target=lambda: answers.update(wait=busy.post("/retrieve", json={"query": "refund", "top_k": 1}))
    )
    waiter.start()
    queued = 'strata_http_requests_in_progress{route="/retrieve"} 1.0'
    for _ in range(3000):  # the retrieval is queued behind the held slot (it cannot run before release)
        if queued in busy.get("/metrics").text:
            break
        threading.Event().wait(0.01)
    assert "wait" not in answers and queued in busy.get("/metrics").text
    release.set()
    holder.join(30)
    waiter.join(60)
    assert answers["hold"].status_code == 200 and answers["wait"].status_code == 200


@pytest.fixture
def outage(tmp_path: Path, memo_encoder) -> Resources:
    """Stores whose Milvus Lite server is gone (SQLite still there)."""
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 's.sqlite3'}", redis_url=None, query_cache=True)
    resources = Resources(settings, encoder=memo_encoder)
    doc = tmp_path / "one.md"
    doc.write_text("# One\n\nA single short document about lighthouses.", encoding="utf-8")
    assert Indexer(resources).index_paths([doc], kb_id="outage").added == 1
    server_manager_instance.release_server(str(settings.milvus.uri))
    return resources


def test_a_failed_retrieval_is_a_503_with_the_meta_record(outage: Resources) -> None:
    with TestClient(
        create_app(outage.settings, resources=outage, warm_up=False), raise_server_exceptions=False
    ) as client:
        response = client.post("/retrieve", json={"query": "lighthouses", "kb_ids": ["outage"]})
        problem = assert_problem(response, 503)
        assert problem["meta"]["status"] == "failed" and problem["meta"]["errors"]
        assert "docs" not in problem and response.headers["retry-after"] == "5"
        # Milvus is shared by every replica: the pod stays in the Service (200 degraded), so clients get this 503
        ready = client.get("/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["components"]["milvus"]["status"] == "down"
        assert ready.json()["components"]["sql"]["status"] == "ok"


def test_redis_down_is_ready_but_degraded(stores: tuple[Settings, Resources], private_redis, memo_encoder) -> None:
    settings, shared = stores
    with_private = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": private_redis.url})})
    # only the cache differs
    resources = Resources(with_private, encoder=memo_encoder, leaf_index=shared.leaf_index, documents=shared.documents)
    private_redis.stop()
    with TestClient(create_app(with_private, resources=resources, warm_up=False)) as client:
        ready = client.get("/ready")
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["components"]["redis"]["status"] == "down"
        answer = client.post("/retrieve", json={"query": "密码重置链接多久失效？", "kb_ids": ["demo"]})
        assert answer.status_code == 200 and answer.json()["docs"]


def test_a_reranker_that_fails_leaves_the_service_ready_but_degraded(make_client: AppFactory) -> None:
    from tests.rag.rerank_server import RerankServer, status

    with RerankServer() as server:  # answers by word overlap until told to fail
        # each /ready checks again (the default reuses a check for 5 s)
        client = make_client(
            rerank={"url": server.url, "read_timeout_s": 1.0, "max_retries": 0}, api={"ready_cache_s": 0}
        )
        query = {"query": "tomatoes deep watering twice a week", "top_k": 3, "kb_ids": ["garden"]}
        assert client.post("/retrieve", json=query).json()["meta"]["rerank"]["status"] == "applied"
        skipped = client.post("/retrieve", json={**query, "rerank": False}).json()["meta"]["rerank"]
        assert skipped == {**skipped, "status": "skipped", "reason": "off for this request"}
        assert client.get("/ready").json()["components"]["reranker"]["status"] == "ok"
        server.behaviour = status(500)
        # a probe answers from the last check while the next one runs: the one after it sees the failure
        ends = time.monotonic() + 10
        while (ready := client.get("/ready")).json()["status"] == "ready" and time.monotonic() < ends:
            time.sleep(0.05)  # the pace of a bounded poll, as a probe's period
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        assert ready.json()["components"]["reranker"]["status"] == "down"
        fallback = client.post("/retrieve", json={**query, "query": "soil pH in spring"})
        assert fallback.status_code == 200 and fallback.json()["meta"]["degraded"] == ["rerank_failed"]


def test_sql_down_keeps_the_pod_reachable_and_its_requests_get_the_503(tmp_path: Path, memo_encoder) -> None:
    unreachable = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/strata"
    settings = make_settings(
        tmp_path, unreachable, redis_url=None, query_cache=True, database={"connect_timeout_s": 1.0}
    )
    resources = Resources(settings, encoder=memo_encoder)
    try:
        with TestClient(create_app(settings, resources=resources), raise_server_exceptions=False) as client:
            ready = client.get("/ready")
            assert (ready.status_code, ready.json()["status"]) == (200, "degraded")
            assert ready.json()["components"]["sql"]["status"] == "down"
            assert "store unavailable" in assert_problem(client.get("/kbs"), 503)["detail"]
            assert client.get("/health").status_code == 200
    finally:
        resources.close()
        server_manager_instance.release_server(str(settings.milvus.uri))
