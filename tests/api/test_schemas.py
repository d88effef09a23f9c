"""The result and its meta record are typed in the API schema, and the JSON sent is ``RetrievalResult.to_dict()``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from strata.api.schemas import (
    DocumentOut,
    MergeRoundOut,
    ModuleResponse,
    RerankOutcomeOut,
    RetrievalMetaOut,
    RetrieveResponse,
    StageErrorOut,
)
from strata.types import (
    MergeRound,
    RerankOutcome,
    RetrievalMeta,
    RetrievalResult,
    RetrievedDocument,
    StageError,
)
from tests.api.conftest import auth

ADMIN = auth("admin-key")
MIRRORS: list[tuple[type[BaseModel], type]] = [
    (DocumentOut, RetrievedDocument), (RetrievalMetaOut, RetrievalMeta), (MergeRoundOut, MergeRound),
    (RerankOutcomeOut, RerankOutcome), (StageErrorOut, StageError),
]  # fmt: skip


def full_result() -> RetrievalResult:
    """A result with every field of the meta record set away from its default."""
    meta = RetrievalMeta(
        query="q", top_k=2, candidate_k=6, status="degraded", mode="dense_fallback", kb_ids=("demo",),
        filters={"modules": ["billing"]}, dense_candidates=6, sparse_candidates=0, fused_candidates=6,
        merge_rounds=(MergeRound(1, 1, 2, 0),), rerank=RerankOutcome("applied", "", "tei", 12.5), returned=2,
        dropped_by_min_score=1, timings_ms={"search": 3.25}, cache="shared", parent_cache={"hits": 1, "misses": 2},
        errors=(StageError("sparse", "DeadlineExceeded", "no time left"),), degraded=("hybrid_search_failed",),
        strategy="fusion", query_variants=("q", "q2"), expansion={"added_terms": ["x"]}, bm25_query={"skipped": "why"},
    )  # fmt: skip
    docs = (RetrievedDocument("a", 0.5, {"chunk_id": "c1", "trace": {"dense_rank": 1}}), RetrievedDocument("b", float("nan")))
    return RetrievalResult(docs, meta)


@pytest.mark.parametrize(("model", "record"), MIRRORS, ids=[m.__name__ for m, _ in MIRRORS])
def test_each_model_mirrors_its_record_field_for_field(model: type[BaseModel], record: type) -> None:
    assert list(model.model_fields) == [f.name for f in dataclasses.fields(record)]


def test_the_models_read_and_write_to_dict_unchanged() -> None:
    body = full_result().to_dict()
    assert body["docs"][1]["score"] is None
    assert RetrieveResponse.model_validate(body).model_dump(mode="json") == body
    with pytest.raises(ValueError, match="Extra inputs"):  # a field the models lack is refused, not dropped
        RetrieveResponse.model_validate({**body, "meta": {**body["meta"], "new_field": 1}})


def test_the_response_is_exactly_to_dict_of_the_result(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    service = client.app.state.service  # type: ignore[attr-defined]
    served: list[RetrievalResult] = []

    def keep(*args: Any, **kwargs: Any) -> RetrievalResult:
        served.append(real(*args, **kwargs))
        return served[-1]

    real = service.retrieve
    monkeypatch.setattr(service, "retrieve", keep)
    query = {"query": "密码重置链接多久失效？", "top_k": 3, "kb_ids": ["demo"], "explain": True}
    response = client.post("/retrieve", json=query, headers=ADMIN)
    assert response.status_code == 200 and len(served) == 1
    body, expected = response.json(), served[0].to_dict()
    assert body == expected and list(body["meta"]) == list(expected["meta"]) and body["docs"]
    assert RetrieveResponse.model_validate(body).model_dump(mode="json") == body


def test_a_module_listing_matches_its_schema(client: TestClient) -> None:
    response = client.post("/retrieve/by-module", json={"module": "billing", "top_k": 3, "kb_ids": ["demo"]}, headers=ADMIN)
    assert response.status_code == 200
    parsed = ModuleResponse.model_validate(response.json())
    assert parsed.meta.mode == "document_order" and parsed.docs


def test_openapi_documents_every_field_of_the_result(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    ok = schema["paths"]["/retrieve"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/RetrieveResponse")
    components = schema["components"]["schemas"]
    assert components["RetrieveResponse"]["properties"]["meta"]["$ref"].endswith("/RetrievalMetaOut")
    meta = components["RetrievalMetaOut"]["properties"]
    assert list(meta) == [f.name for f in dataclasses.fields(RetrievalMeta)]
    assert meta["cache"]["enum"] == ["hit", "miss", "shared", "off"] and meta["rerank"]["$ref"].endswith("/RerankOutcomeOut")
    assert set(components["DocumentOut"]["properties"]) == {"content", "score", "metadata"}
