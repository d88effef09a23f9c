"""What the retrieval routes do besides calling the engine: scope, limits, matching, answers."""

from __future__ import annotations

import difflib
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from strata.api.auth import Principal
from strata.api.deps import not_found
from strata.api.problems import RETRIEVAL_FAILED, Problem, Refusal, refusal_of
from strata.api.schemas import ModuleListingMeta, ModuleOut, ModuleResponse, SkillOut
from strata.api.service import Service
from strata.errors import DeadlineExceeded, InvalidArgumentError
from strata.rag.budget import fit_to_budget
from strata.rag.retrieve import evidence_metadata
from strata.request import RetrievalRequest
from strata.types import Chunk, Filters, RetrievalMeta, RetrievalResult, RetrievedDocument

CLOSEST_SHOWN = 5


def check_limits(service: Service, query: str, top_k: int, variants: Sequence[str] = ()) -> None:
    """The settings' limits (``max_query_chars``, ``max_top_k``), checked as the library checks them."""
    try:
        service.settings.retrieval.check_query(query, top_k, variants)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


def search_scope(service: Service, principal: Principal, requested: Sequence[str] | None) -> list[str] | None:
    """Requested ∩ readable kbs; a kb the key may not read is a 404, as if it did not exist.

    Without requested kbs a restricted key searches those of its kbs that exist (a grant may
    name a kb before its first upload).
    """
    try:
        scope = principal.search_scope(requested)
    except KeyError as exc:
        raise not_found(str(exc.args[0])) from None
    if not requested and scope is not None:
        existing = {kb.kb_id for kb in service.resources.documents.kbs.list_kbs()}
        scope = [kb for kb in scope if kb in existing]
    if scope == []:
        raise Problem(404, "this key may read no knowledge base", title="Not Found")
    return scope


def retrieval(result: RetrievalResult, *, explain: bool) -> RetrievalResult:
    """The result as ``retrieve_documents`` returns it (without the per-document trace unless ``explain``);
    a failed retrieval 503 (504 when its deadline ran out), with the meta record. An unknown kb never gets
    here: the service's engine raises ``NotFoundError`` for it (``Retriever(refuse_unknown_kbs=True)``)."""
    meta = result.meta
    if meta.status == "failed":
        reasons = "; ".join(e.message for e in meta.errors)[:500]
        why = f"retrieval failed: {reasons}" if reasons else "retrieval failed"
        raise Problem.of(failure(meta), why, meta=meta.to_dict())
    return result if explain else replace(result, docs=tuple(_without_trace(d) for d in result.docs))


def _without_trace(doc: RetrievedDocument) -> RetrievedDocument:
    return replace(doc, metadata={k: v for k, v in doc.metadata.items() if k != "trace"})


def failure(meta: RetrievalMeta) -> Refusal:
    """How a failed retrieval answers: a deadline that ran out as ``DeadlineExceeded`` (504: a longer one may
    succeed), anything else as a 503 worth retrying."""
    timed_out = DeadlineExceeded.reason in meta.degraded or any(
        e.error == DeadlineExceeded.__name__ for e in meta.errors
    )
    return refusal_of(DeadlineExceeded) if timed_out else RETRIEVAL_FAILED


# -- by skill -------------------------------------------------------------------


@dataclass(frozen=True)
class SkillSelection:
    """The skill's synonym group and the known skill points it names."""

    terms: tuple[str, ...]
    matched: tuple[str, ...]

    @property
    def query(self) -> str:
        return " ".join(self.terms)

    @property
    def filters(self) -> Filters | None:
        return Filters(skill_points=self.matched) if self.matched else None

    def describe(self) -> SkillOut:
        return SkillOut(terms=list(self.terms), matched_skill_points=list(self.matched), filtered=bool(self.matched))


def with_skill_points(request: RetrievalRequest, selection: SkillSelection) -> RetrievalRequest:
    """``request`` restricted to the skill points the skill names (when it names known ones); a request that sets
    that filter itself is refused: the route sets it."""
    own = request.filters or Filters()
    if own.skill_points:
        raise InvalidArgumentError("/retrieve/by-skill sets the skill_points filter from the skill: leave it out")
    return replace(request, filters=replace(own, skill_points=selection.matched)) if selection.matched else request


def skill_selection(service: Service, skill: str, scope: Sequence[str] | None) -> SkillSelection:
    terms = service.synonyms.group_of(skill)
    wanted = {t.casefold() for t in terms}
    known = service.catalog.vocabulary(scope).skill_points
    return SkillSelection(terms, tuple(p for p in known if p.casefold() in wanted))


# -- by module ------------------------------------------------------------------


@dataclass(frozen=True)
class ModuleMatch:
    requested: str
    module: str
    score: float

    @property
    def filters(self) -> Filters:
        return Filters(modules=(self.module,))

    def describe(self) -> ModuleOut:
        return ModuleOut(requested=self.requested, matched=self.module, score=round(self.score, 3))


def with_module(request: RetrievalRequest, match: ModuleMatch) -> RetrievalRequest:
    """``request`` restricted to the matched module; a request that sets that filter itself is refused."""
    own = request.filters or Filters()
    if own.modules:
        raise InvalidArgumentError("/retrieve/by-module sets the modules filter from the module: leave it out")
    return replace(request, filters=replace(own, modules=(match.module,)))


def similarity(a: str, b: str) -> float:
    a, b = a.casefold().strip(), b.casefold().strip()
    return 1.0 if a == b else difflib.SequenceMatcher(None, a, b).ratio()


def match_module(service: Service, requested: str, scope: Sequence[str] | None) -> ModuleMatch:
    """The known module closest to ``requested``; a 404 naming the closest ones when none is close enough."""
    known = service.catalog.vocabulary(scope).modules
    ranked = sorted(((similarity(requested, m), m) for m in known), key=lambda sm: (-sm[0], sm[1]))
    threshold = service.settings.retrieval.module_match_threshold
    if not ranked or ranked[0][0] < threshold:
        closest: list[dict[str, Any]] = [{"module": m, "score": round(s, 3)} for s, m in ranked[:CLOSEST_SHOWN]]
        names = ", ".join(str(c["module"]) for c in closest) or "none"
        raise Problem(
            404,
            f"no module matches {requested!r} (similarity >= {threshold}); closest: {names}",
            title="Module Not Found",
            closest=closest,
        )
    score, module = ranked[0]
    return ModuleMatch(requested, module, score)


def module_listing(
    service: Service, match: ModuleMatch, scope: Sequence[str] | None, request: RetrievalRequest, *, level: int
) -> ModuleResponse:
    """The module's chunks of one level in document order (no query to rank by): ``request``'s ``top_k`` of them,
    within its ``max_chars`` (``strata.rag.budget``, as a retrieval's)."""
    chunks = service.catalog.module_chunks(scope, match.module, level=level, limit=request.top_k)
    docs = tuple(_listed(c) for c in chunks)
    if request.max_chars is not None:
        docs = tuple(fit_to_budget(docs, request.max_chars))
    kb_ids = tuple(scope) if scope is not None else None
    meta = ModuleListingMeta(top_k=request.top_k, level=level, kb_ids=kb_ids, returned=len(docs))
    return ModuleResponse(docs, meta, match.describe())


def _listed(chunk: Chunk) -> RetrievedDocument:
    """A listed chunk as evidence; it has no score (NaN: ``null`` on the wire). Nothing in it was hit by a query:
    its hit offsets are the whole chunk's, as every document's metadata has them."""
    hit = {"hit_start": chunk.char_start, "hit_end": chunk.char_end}
    return RetrievedDocument(chunk.text, math.nan, {**evidence_metadata(chunk), **hit, "ordinal": chunk.ordinal})
