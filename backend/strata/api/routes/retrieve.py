"""``POST /retrieve``, ``/retrieve/by-skill`` and ``/retrieve/by-module``.

Each body holds a ``strata.request.RetrievalRequest`` (``strata.api.schemas``), which the routes hand the
engine with the caller's scope: every search runs on the intersection of the requested kbs and the kbs the
key may read (never on the request alone), so the Milvus filter and the query-cache key both carry it. The
by-skill and by-module routes add their own query and filter to the request and take every option
``/retrieve`` takes.
"""

from __future__ import annotations

from dataclasses import replace

from fastapi import APIRouter
from starlette.responses import JSONResponse

from strata.api import answers
from strata.api.deps import PrincipalDep, ServiceDep
from strata.api.openapi import problems
from strata.api.schemas import ModuleRequest, ModuleResponse, RetrieveRequest, SkillRequest, SkillResponse
from strata.types import RetrievalResult

# 504: the deadline ran out. JSONResponse: the records' JSON (strata.wire) written by json.dumps, byte for byte as
# ``RetrievalResult.to_dict()`` always was (pydantic's own writer spells some floats otherwise: 0.00001 for 1e-05)
router = APIRouter(tags=["retrieval"], responses=problems(404, 504), default_response_class=JSONResponse)


@router.post("/retrieve", summary="evidence for a query, with the meta record", response_model=RetrievalResult)
def retrieve(body: RetrieveRequest, service: ServiceDep, principal: PrincipalDep) -> RetrievalResult:
    request = body.to_request()
    answers.check_limits(service, request.query, request.top_k, request.queries or ())
    scope = answers.search_scope(service, principal, request.kb_ids)
    result = service.retrieve(body.to_request(kb_ids=scope), principal=principal)
    return answers.retrieval(result, explain=body.explain)


@router.post(
    "/retrieve/by-skill",
    summary="evidence for a skill point (expanded through the synonyms)",
    response_model=SkillResponse,
)
def by_skill(body: SkillRequest, service: ServiceDep, principal: PrincipalDep) -> SkillResponse:
    asked = body.to_request(query=body.query or body.skill)  # the skill is the query until its group is read
    answers.check_limits(service, asked.query, asked.top_k, asked.queries or ())
    scope = answers.search_scope(service, principal, asked.kb_ids)
    selection = answers.skill_selection(service, body.skill, scope)
    request = replace(asked, query=body.query or selection.query, kb_ids=scope)
    result = service.retrieve(answers.with_skill_points(request, selection), principal=principal)
    answer = answers.retrieval(result, explain=body.explain)
    return SkillResponse(answer.docs, answer.meta, skill=selection.describe())


@router.post(
    "/retrieve/by-module",
    summary="chunks of a module's documents, ranked by a query or in document order",
    response_model=ModuleResponse,
)
def by_module(body: ModuleRequest, service: ServiceDep, principal: PrincipalDep) -> ModuleResponse:
    asked = body.to_request(query=body.query or body.module)  # the module is the query of a listing's checks
    answers.check_limits(service, asked.query, asked.top_k, asked.queries or ())
    scope = answers.search_scope(service, principal, asked.kb_ids)
    match = answers.match_module(service, body.module, scope)
    if body.query is None:
        return answers.module_listing(service, match, scope, asked, level=body.level)
    result = service.retrieve(answers.with_module(replace(asked, kb_ids=scope), match), principal=principal)
    answer = answers.retrieval(result, explain=body.explain)
    return ModuleResponse(answer.docs, answer.meta, match.describe())
