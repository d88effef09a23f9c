"""The result and its meta record have one definition (``strata.types``): the library's dict, the service's answer,
the OpenAPI schema and the client's parsing all come from it (``strata.wire``). So do the kb routes' answers (the
indexing report, the stats) and the members a problem document may carry (a failed retrieval's meta record)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any, TypeVar

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from starlette.responses import JSONResponse

from strata.api.schemas import ProblemOut, RetrieveRequest
from strata.errors import InvalidArgumentError
from strata.indexing.consistency import KbStats, check_leaves
from strata.indexing.report import IndexReport
from strata.request import option_names
from strata.types import (
    MergeRound,
    RerankOutcome,
    RetrievalMeta,
    RetrievalResult,
    RetrievedDocument,
    StageError,
)
from strata.wire import adapter
from tests.support.api import auth

ADMIN = auth("admin-key")
T = TypeVar("T")
RECORDS = (RetrievedDocument, RetrievalMeta, MergeRound, RerankOutcome, StageError, RetrievalResult)


def serving(client: TestClient, monkeypatch: pytest.MonkeyPatch, method: str, change: Callable[[T], T]) -> list[T]:
    """What the service's ``method`` answers from now on, changed by ``change``: the list of the answers it gave."""
    service = client.app.state.service  # type: ignore[attr-defined]
    real, served = getattr(service, method), []

    def answer(*args: Any, **kwargs: Any) -> T:
        served.append(change(real(*args, **kwargs)))
        return served[-1]

    monkeypatch.setattr(service, method, answer)
    return served


def full_meta() -> RetrievalMeta:
    """A meta record with every field set away from its default (a new field must be added here)."""
    return RetrievalMeta(
        query="q",
        top_k=2,
        candidate_k=6,
        status="degraded",
        mode="dense_fallback",
        kb_ids=("demo",),
        filters={"modules": ["billing"]},
        dense_candidates=6,
        sparse_candidates=1,
        fused_candidates=6,
        merge_rounds=(MergeRound(1, 1, 2, 0),),
        rerank=RerankOutcome("applied", "", "tei", 12.5),
        returned=2,
        dropped_by_min_score=1,
        timings_ms={"search": 3.25},
        cache="shared",
        parent_cache={"hits": 1, "misses": 2},
        errors=(StageError("sparse", "DeadlineExceeded", "no time left"),),
        degraded=("hybrid_search_failed",),
        strategy="fusion",
        query_variants=("q", "q2"),
        expansion={"added_terms": ["x"]},
        bm25_query={"skipped": "why"},
    )


def full_result() -> RetrievalResult:
    docs = (RetrievedDocument("a", 0.5, {"chunk_id": "c1", "trace": {"dense_rank": 1}}), RetrievedDocument("b", 1e-05))
    return RetrievalResult(docs, full_meta())


def test_the_full_meta_record_sets_every_field() -> None:
    """So that the round trips below cover a field added to the record (its one test edit)."""
    defaults = RetrievalMeta(query="", top_k=0, candidate_k=0)
    meta = full_meta()
    assert [f.name for f in dataclasses.fields(meta) if getattr(meta, f.name) == getattr(defaults, f.name)] == []


def test_to_dict_is_json_in_field_order_and_from_dict_reads_it_back() -> None:
    result = full_result()
    body = result.to_dict()
    assert list(body["meta"]) == [f.name for f in dataclasses.fields(RetrievalMeta)]
    assert body["meta"]["kb_ids"] == ["demo"] and body["meta"]["merge_rounds"] == [
        {"round": 1, "parents_merged": 1, "children_replaced": 2, "parents_missing": 0}
    ]
    assert json.loads(json.dumps(body, allow_nan=False)) == body
    assert RetrievalResult.from_dict(json.loads(json.dumps(body))) == result


def test_non_finite_floats_are_null_and_read_back_as_nan() -> None:
    meta = dataclasses.replace(
        full_meta(), timings_ms={"search": math.inf}, rerank=RerankOutcome("applied", "", "tei", math.nan)
    )
    result = RetrievalResult((RetrievedDocument("a", math.nan, {"x": -math.inf, "n": [1.5, math.nan]}),), meta)
    body = result.to_dict()
    assert body["docs"][0] == {"content": "a", "score": None, "metadata": {"x": None, "n": [1.5, None]}}
    assert body["meta"]["timings_ms"] == {"search": None} and body["meta"]["rerank"]["latency_ms"] is None
    json.dumps(body, allow_nan=False)
    assert math.isnan(RetrievalResult.from_dict(body).docs[0].score)


def test_metadata_values_json_lacks_are_made_json_safe() -> None:
    """Keys become strings, tuples and sets lists, anything else its str (a front-matter date, a path)."""
    at = datetime.datetime(2024, 1, 2, 3, 4)
    metadata = {"date": at.date(), "at": at, 3: ("a", "b"), "tags": frozenset({"t"}), "path": PurePosixPath("/kb/a.md")}
    meta = dataclasses.replace(full_meta(), filters={"doc_ids": ("d1",)}, bm25_query={"dropped": {"的"}})
    body = RetrievalResult((RetrievedDocument("a", 1.0, metadata),), meta).to_dict()
    expected = {"date": "2024-01-02", "at": "2024-01-02 03:04:00", "3": ["a", "b"], "tags": ["t"], "path": "/kb/a.md"}
    assert body["docs"][0]["metadata"] == expected
    assert body["meta"]["filters"] == {"doc_ids": ["d1"]} and body["meta"]["bm25_query"] == {"dropped": ["的"]}


def test_a_record_from_another_version_is_read_by_what_it_shares() -> None:
    """A newer service's field is ignored; a field an older one lacks takes its default."""
    body = full_result().to_dict()
    newer = {**body, "extra": 1, "meta": {**body["meta"], "new_field": {"x": 1}}}
    assert RetrievalResult.from_dict(newer) == full_result()
    older = {k: v for k, v in body["meta"].items() if k not in ("bm25_query", "expansion")}
    assert RetrievalMeta.from_dict(older) == dataclasses.replace(full_meta(), bm25_query={}, expansion={})
    with pytest.raises(ValueError, match="candidate_k"):
        RetrievalMeta.from_dict({"query": "q", "top_k": 1})


def test_the_response_is_exactly_to_dict_of_the_result_byte_for_byte(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = RetrievedDocument("tiny", 1e-05, {"f": 1e-05})  # a score json.dumps and pydantic spell differently
    served = serving(
        client, monkeypatch, "retrieve", lambda result: dataclasses.replace(result, docs=(*result.docs, tiny))
    )
    query = {"query": "密码重置链接多久失效？", "top_k": 3, "kb_ids": ["demo"], "explain": True}
    response = client.post("/retrieve", json=query, headers=ADMIN)
    assert response.status_code == 200 and len(served) == 1
    assert response.content == JSONResponse(served[0].to_dict()).body and len(response.json()["docs"]) > 1
    assert b"1e-05" in response.content
    adapter(RetrievalResult).dump_python(served[0], mode="json", warnings="error")  # every field of its declared type


def test_without_explain_the_trace_is_left_out(client: TestClient) -> None:
    query = {"query": "密码重置链接多久失效？", "top_k": 3, "kb_ids": ["demo"]}
    plain = client.post("/retrieve", json=query, headers=ADMIN).json()
    explained = client.post("/retrieve", json={**query, "explain": True}, headers=ADMIN).json()
    assert plain["docs"] and all("trace" not in d["metadata"] for d in plain["docs"])
    assert all("trace" in d["metadata"] for d in explained["docs"])
    assert [{k: v for k, v in d["metadata"].items() if k != "trace"} for d in explained["docs"]] == [
        d["metadata"] for d in plain["docs"]
    ]


def test_skill_and_module_answers_are_the_result_and_their_match(client: TestClient) -> None:
    skill = client.post("/retrieve/by-skill", json={"skill": "浇水", "top_k": 2}, headers=ADMIN).json()
    assert list(skill) == ["docs", "meta", "skill"] and RetrievalMeta.from_dict(skill["meta"]).query
    assert skill["skill"]["terms"] and set(skill["skill"]) == {"terms", "matched_skill_points", "filtered"}
    module = {"module": "billing", "query": "invoice", "top_k": 2}
    ranked = client.post("/retrieve/by-module", json=module, headers=ADMIN)
    assert list(ranked.json()) == ["docs", "meta", "module"] and ranked.json()["module"]["matched"] == "billing"


def test_a_module_listing_has_its_own_meta_and_unscored_docs(client: TestClient) -> None:
    listing = {"module": "billing", "top_k": 3, "kb_ids": ["demo"]}
    response = client.post("/retrieve/by-module", json=listing, headers=ADMIN)
    assert response.status_code == 200
    body = response.json()
    expected = {"status": "ok", "mode": "document_order", "top_k": 3, "level": 1, "kb_ids": ["demo"]}
    assert body["meta"] == {**expected, "returned": len(body["docs"])}
    assert body["docs"] and all(d["score"] is None and d["metadata"]["doc_id"] for d in body["docs"])


def test_openapi_documents_every_field_of_the_result_from_the_records(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    ok = schema["paths"]["/retrieve"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok["$ref"].endswith("/RetrievalResult")
    components = schema["components"]["schemas"]
    assert components["RetrievalResult"]["properties"]["meta"]["$ref"].endswith("/RetrievalMeta")
    for record in RECORDS:  # every field, each one present in an answer
        published = components[record.__name__]
        assert list(published["properties"]) == published["required"] == [f.name for f in dataclasses.fields(record)]
    meta = components["RetrievalMeta"]["properties"]
    assert meta["cache"]["enum"] == ["hit", "miss", "shared", "off"]
    assert meta["rerank"]["$ref"].endswith("/RerankOutcome")
    assert meta["candidate_k"]["description"] == "fused candidates kept before merging and rerank"  # the docstring
    assert {"type": "null"} in components["RetrievedDocument"]["properties"]["score"]["anyOf"]
    skill = components["SkillResponse"]["properties"]
    assert list(skill) == ["docs", "meta", "skill"] and skill["meta"]["$ref"].endswith("/RetrievalMeta")
    module_meta = components["ModuleResponse"]["properties"]["meta"]["anyOf"]
    assert [m["$ref"].rsplit("/", 1)[1] for m in module_meta] == ["RetrievalMeta", "ModuleListingMeta"]


@pytest.mark.parametrize(("query", "why"), [("a\x00b", "control character U+0000"), ("  \n", "must not be blank")])
def test_a_refused_string_is_an_invalid_argument(query: str, why: str) -> None:
    with pytest.raises(ValidationError) as refused:
        RetrieveRequest.model_validate({"query": query})
    error = refused.value.errors()[0]["ctx"]["error"]
    assert isinstance(error, InvalidArgumentError) and why in str(error)


# -- the requests: one record (strata.request) in every body ------------------------------------------------------


def test_openapi_publishes_every_field_of_the_request_in_every_retrieval_body(client: TestClient) -> None:
    components = client.get("/openapi.json").json()["components"]["schemas"]
    for body, own in [("RetrieveRequest", {"explain"}), ("SkillRequest", {"skill"}), ("ModuleRequest", {"module"})]:
        assert set(option_names()) | own <= set(components[body]["properties"]), body
    assert components["SkillRequest"]["required"] == ["skill"] and components["ModuleRequest"]["required"] == ["module"]


LONG = 120  # characters of evidence: less than one merged section of examples/kb


@pytest.mark.parametrize(
    ("path", "own"),
    [
        ("/retrieve", {"query": "密码重置链接多久失效？"}),
        ("/retrieve/by-skill", {"skill": "浇水", "kb_ids": ["garden"]}),
        ("/retrieve/by-module", {"module": "billing", "query": "invoice refund"}),
        ("/retrieve/by-module", {"module": "billing"}),  # a listing
    ],
)
def test_every_retrieval_route_takes_max_chars_and_meta_counts_what_is_returned(
    client: TestClient, path: str, own: dict[str, Any]
) -> None:
    whole = client.post(path, json={"top_k": 3, **own}, headers=ADMIN).json()
    cut = client.post(path, json={"top_k": 3, "max_chars": LONG, **own}, headers=ADMIN).json()
    assert sum(len(d["content"]) for d in whole["docs"]) > LONG, whole  # the budget cuts something
    assert 0 < sum(len(d["content"]) for d in cut["docs"]) <= LONG
    assert cut["meta"]["returned"] == len(cut["docs"]) and whole["meta"]["returned"] == len(whole["docs"])
    assert all({"hit_start", "hit_end"} <= set(d["metadata"]) for d in whole["docs"])


def test_a_route_that_sets_a_filter_refuses_a_request_that_sets_it_too(client: TestClient) -> None:
    """Refused by its schema, which allows that filter empty only: a body its OpenAPI schema allows is never refused
    (the fuzz test found ``/retrieve/by-skill`` offering ``skill_points`` and then refusing it)."""
    skill = {"skill": "浇水", "filters": {"skill_points": ["x"]}}
    module = {"module": "billing", "query": "invoice", "filters": {"modules": ["auth"]}}
    for path, body, name in (("/retrieve/by-skill", skill, "skill_points"), ("/retrieve/by-module", module, "modules")):
        refused = client.post(path, json=body, headers=ADMIN)
        assert refused.status_code == 422 and name in refused.text, refused.text
        offered = _filters_schema(client.get("/openapi.json").json(), path)
        assert offered["properties"][name]["maxItems"] == 0 and offered.get("additionalProperties") is False, offered
        taken = client.post(path, json={**body, "top_k": 2, "filters": {name: []}}, headers=ADMIN)
        assert taken.status_code == 200, taken.text  # a request's whole wire form lists every filter, empty or not
        assert {"doc_ids", "source_prefix"} <= set(offered["properties"])
    other = {"module": "billing", "query": "invoice", "top_k": 2, "filters": {"source_prefix": "billing"}}
    assert client.post("/retrieve/by-module", json=other, headers=ADMIN).status_code == 200


@pytest.mark.parametrize("path, member", [("/retrieve/by-skill", "skill"), ("/retrieve/by-module", "module")])
def test_a_blank_skill_or_module_is_refused_by_the_schema_that_says_so(
    client: TestClient, path: str, member: str
) -> None:
    """The skill or module is the query when none is given: the schema refuses a blank one, as the query's does
    (the fuzz test sent ``{"module": " "}``, valid by the schema then, and got the query check's 422)."""
    import re

    body = client.get("/openapi.json").json()["components"]["schemas"]
    pattern = next(s["properties"][member]["pattern"] for s in body.values() if member in s.get("properties", {}))
    assert not re.search(pattern, " \u00a0") and re.search(pattern, "billing")
    refused = client.post(path, json={member: " "}, headers=ADMIN)
    assert refused.status_code == 422 and "must not be blank" in refused.text, refused.text


def _filters_schema(openapi: dict[str, Any], path: str) -> dict[str, Any]:
    """The JSON schema of ``path``'s ``filters`` member (its non-null variant), references resolved."""
    schemas = openapi["components"]["schemas"]

    def resolved(node: dict[str, Any]) -> dict[str, Any]:
        return schemas[node["$ref"].rsplit("/", 1)[1]] if "$ref" in node else node

    body = resolved(openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"])
    member = body["properties"]["filters"]
    (variant,) = [resolved(v) for v in member.get("anyOf", [member]) if v.get("type") != "null"]
    return variant


# -- the kb routes' answers: the indexing report and the stats, each from its one record ---------------------------


def old_report_shape(report: IndexReport) -> dict[str, Any]:
    """The upload's answer as ``IndexReport.to_dict`` built it by hand before the report had a wire shape."""
    data = {f.name: getattr(report, f.name) for f in dataclasses.fields(report)}
    data["chunks_per_s"] = round(report.chunks_written / report.seconds, 2) if report.seconds > 0 else 0.0
    data["seconds"] = round(report.seconds, 3)
    data["encode_seconds"] = round(report.encode_seconds, 3)
    return data


def old_stats_shape(resources: Any, kb_id: str) -> dict[str, Any]:
    """``GET /kbs/{kb}/stats`` as ``consistency.kb_stats`` built it by hand before the stats had a wire shape."""
    kb = resources.documents.kbs.get_kb(kb_id)
    sql = resources.documents.versions.stats(kb_id)
    check = check_leaves(resources.leaf_index, kb_id, resources.documents.versions.of_kb(kb_id))
    return {
        "kb": kb_id,
        "documents": sql["documents_by_status"].get("active", 0),
        "documents_by_status": sql["documents_by_status"],
        "chunks_by_level": sql["chunks_by_level"],
        "leaves_in_milvus": check.found,
        "versions_probed": check.versions_probed,
        "versions_absent_in_milvus": check.absent_count,
        "encoder": {"name": kb.encoder, "dim": kb.dim},
        "generation": kb.generation,
        "consistent": check.consistent and check.found == sql["chunks_by_level"]["3"],
        "difference": check.difference(),
    }


def test_the_upload_answer_is_the_old_report_dict_byte_for_byte(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def with_awkward_values(report: IndexReport) -> IndexReport:  # values the old dict rounded, listed, computed
        changes = {"seconds": 1.23456789, "encode_seconds": 0.0004567, "chunks_written": 7, "notes": ["a note"]}
        return dataclasses.replace(report, failures=[{"source": "x.md", "reason": "why"}], **changes)

    served = serving(client, monkeypatch, "index_folder", with_awkward_values)
    files = [("files", ("a.md", b"# A\n\nText about lighthouses.\n", "text/markdown"))]
    response = client.post("/kbs/garden-uploads/documents", params={"dry_run": "true"}, files=files, headers=ADMIN)
    assert response.status_code == 200 and len(served) == 1
    assert response.content == JSONResponse(old_report_shape(served[0])).body
    assert response.json()["chunks_per_s"] == 5.67 and response.json()["seconds"] == 1.235
    assert served[0].to_dict() == response.json()  # the CLI's --json is the same record's JSON


def test_the_stats_answer_is_the_old_stats_dict_byte_for_byte(client: TestClient) -> None:
    resources = client.app.state.service.resources  # type: ignore[attr-defined]
    response = client.get("/kbs/demo/stats", headers=ADMIN)
    assert response.status_code == 200 and response.json()["consistent"] is True
    assert response.content == JSONResponse(old_stats_shape(resources, "demo")).body


def test_openapi_documents_the_upload_report_and_the_stats_from_their_records(client: TestClient) -> None:
    schema = client.get("/openapi.json").json()
    paths, components = schema["paths"], schema["components"]["schemas"]
    for path, method, record, computed in [
        ("/kbs/{kb}/documents", "post", IndexReport, ["chunks_per_s"]),
        ("/kbs/{kb}/stats", "get", KbStats, []),
    ]:
        ok = paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok["$ref"].endswith(f"/{record.__name__}")
        published = components[record.__name__]
        fields = [f.name for f in dataclasses.fields(record)] + computed
        assert list(published["properties"]) == published["required"] == fields
    assert components["KbStats"]["properties"]["encoder"]["$ref"].endswith("/KbEncoder")
    assert components["IndexReport"]["properties"]["leaves_kept"]["description"].startswith("leaves of resumed")


# -- problem documents: the members some of them carry -------------------------------------------------------------


def test_openapi_describes_the_meta_and_errors_members_of_a_problem(client: TestClient) -> None:
    components = client.get("/openapi.json").json()["components"]["schemas"]
    problem = components["ProblemOut"]
    assert problem["properties"]["meta"]["$ref"] == "#/components/schemas/RetrievalMeta"
    assert problem["properties"]["errors"]["items"]["$ref"] == "#/components/schemas/ProblemFieldError"
    assert {"meta", "errors"}.isdisjoint(problem["required"])  # present only in the problems that carry them
    assert "default" not in problem["properties"]["meta"]  # absent, never null
    assert list(components["ProblemFieldError"]["properties"]) == ["loc", "msg", "type"]
    meta = components["RetrievalMeta"]  # the one the retrieval answers publish, not a copy
    assert list(meta["properties"]) == meta["required"] == [f.name for f in dataclasses.fields(RetrievalMeta)]


def test_a_failed_retrievals_problem_carries_the_meta_record_its_schema_describes(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    service = client.app.state.service  # type: ignore[attr-defined]
    failed = dataclasses.replace(
        full_meta(), status="failed", degraded=(), errors=(StageError("dense", "StoreError", "milvus down"),)
    )
    monkeypatch.setattr(service, "retrieve", lambda *args, **kwargs: RetrievalResult((), failed))
    response = client.post("/retrieve", json={"query": "q", "kb_ids": ["demo"]}, headers=ADMIN)
    assert response.status_code == 503 and response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert set(body) <= set(ProblemOut.model_fields)  # every member described
    assert ProblemOut.model_validate(body).meta == failed and body["meta"] == failed.to_dict()
    invalid = client.post("/retrieve", json={"query": ""}, headers=ADMIN).json()
    assert set(invalid) <= set(ProblemOut.model_fields) and ProblemOut.model_validate(invalid).errors
