"""``POST /retrieve``, ``/retrieve/by-skill`` and ``/retrieve/by-module``.

Every search runs on the intersection of the requested kbs and the kbs the
key may read (never on the request alone), so the Milvus filter and the
query-cache key both carry the caller's scope.
"""

from __future__ import annotations

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
    answers.check_limits(service, body.query, body.top_k, body.queries or ())
    scope = answers.search_scope(service, principal, body.kb_ids)
    filters = body.filters.to_filters() if body.filters else None
    result = service.retrieve(
        body.query,
        body.top_k,
        kb_ids=scope,
        filters=filters,
        rerank=body.rerank,
        expand=body.expand,
        strategy=body.strategy,
        queries=body.queries,
        deadline_ms=body.deadline_ms,
        max_chars=body.max_chars,
        principal=principal,
    )
    return answers.retrieval(result, explain=body.explain)


@router.post(
    "/retrieve/by-skill",
    summary="evidence for a skill point (expanded through the synonyms)",
    response_model=SkillResponse,
)
def by_skill(body: SkillRequest, service: ServiceDep, principal: PrincipalDep) -> SkillResponse:
    answers.check_limits(service, body.query or body.skill, body.top_k)
    scope = answers.search_scope(service, principal, body.kb_ids)
    selection = answers.skill_selection(service, body.skill, scope)
    result = service.retrieve(
        body.query or selection.query, body.top_k, kb_ids=scope, filters=selection.filters, principal=principal
    )
    answer = answers.retrieval(result, explain=body.explain)
    return SkillResponse(answer.docs, answer.meta, skill=selection.describe())


@router.post(
    "/retrieve/by-module",
    summary="chunks of a module's documents, ranked by a query or in document order",
    response_model=ModuleResponse,
)
def by_module(body: ModuleRequest, service: ServiceDep, principal: PrincipalDep) -> ModuleResponse:
    answers.check_limits(service, body.query or body.module, body.top_k)
    scope = answers.search_scope(service, principal, body.kb_ids)
    match = answers.match_module(service, body.module, scope)
    if body.query is None:
        return answers.module_listing(service, match, scope, top_k=body.top_k, level=body.level)
    result = service.retrieve(body.query, body.top_k, kb_ids=scope, filters=match.filters, principal=principal)
    answer = answers.retrieval(result, explain=body.explain)
    return ModuleResponse(answer.docs, answer.meta, match.describe())
