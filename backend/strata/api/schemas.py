"""HTTP request and response schemas (pydantic lives here, at the edge only).

Strings reject control characters (a query may hold tabs and newlines) and
lone surrogates; unknown fields are refused, so the filter keys are an
allowlist. The limits that come from settings (``max_top_k``,
``max_query_chars``) are checked in the routes by the library's own check
(``RetrievalSettings.check_query``, the same message everywhere); the fields
they bound name their setting, and ``publish_limits`` writes the running
values into the OpenAPI document.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from strata.config import RetrievalSettings
from strata.strategy_table import StrategyName
from strata.types import CacheState, Filters, Mode, RerankStatus, Status

MAX_DEADLINE_MS = 3_600_000  # a bound for the schema only: the service's own deadline caps it long before
KB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
LIMIT_KEY = "x-strata-limit"  # OpenAPI extension: the setting whose running value bounds the field
LIMITS = {"max_query_chars": "maxLength", "max_top_k": "maximum"}  # setting -> JSON Schema keyword


_CONTROL = r"\u0000-\u001f\u007f-\u009f"  # Cc, as ranges Python's re and JSON Schema both read
_TEXT_CONTROL = r"\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f"  # the same, tabs and newlines allowed
_SURROGATES = r"\ud800-\udfff"  # lone surrogates (Cs) are refused too; the published pattern leaves them out, as
# schemathesis drops a pattern that names them, and a JSON text decodes to them only from a lone \uD8xx escape
NAME_PATTERN = rf"^[^{_CONTROL}]*$"
TEXT_PATTERN = rf"^[^{_TEXT_CONTROL}]*[^\s{_TEXT_CONTROL}][^{_TEXT_CONTROL}]*$"  # not blank either


def _matching(pattern: str, why: str) -> AfterValidator:
    """The check of ``pattern`` by Python's ``re``, which the OpenAPI document publishes (pydantic's own
    ``pattern`` is another regex engine, one without lone surrogates)."""
    compiled = re.compile(pattern)
    refused = re.compile(f"[{_CONTROL}{_SURROGATES}]" if pattern == NAME_PATTERN else f"[{_TEXT_CONTROL}{_SURROGATES}]")

    def check(value: str) -> str:
        found = refused.search(value)
        if found:
            raise ValueError(f"control character U+{ord(found.group()):04X} is not allowed")
        if not compiled.search(value):
            raise ValueError(why)
        return value

    return AfterValidator(check)


_no_control = _matching(NAME_PATTERN, "control characters are not allowed")
_text = _matching(TEXT_PATTERN, "must not be blank")


QueryText = Annotated[
    str, StringConstraints(min_length=1), _text,
    Field(json_schema_extra={LIMIT_KEY: "max_query_chars", "pattern": TEXT_PATTERN}),
]
Name = Annotated[
    str, StringConstraints(min_length=1, max_length=512), _no_control, Field(json_schema_extra={"pattern": NAME_PATTERN})
]
KbId = Annotated[str, StringConstraints(pattern=KB_ID_PATTERN)]
TopK = Annotated[
    int, Field(description="results wanted", json_schema_extra={"minimum": 1, LIMIT_KEY: "max_top_k"})
]


def publish_limits(node: Any, retrieval: RetrievalSettings) -> Any:
    """``node`` (an OpenAPI document) with the running limits on every field that names one, in place."""
    if isinstance(node, dict):
        if node.get(LIMIT_KEY) in LIMITS:
            node[LIMITS[node[LIMIT_KEY]]] = getattr(retrieval, node[LIMIT_KEY])
        for child in node.values():
            publish_limits(child, retrieval)
    elif isinstance(node, list):
        for child in node:
            publish_limits(child, retrieval)
    return node


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FiltersIn(_Strict):
    """Restrictions of a search, ANDed; the only filter keys accepted."""

    modules: list[Name] = Field(default_factory=list, max_length=50)
    skill_points: list[Name] = Field(default_factory=list, max_length=50)
    doc_ids: list[
        Annotated[str, StringConstraints(min_length=1, max_length=2048), _no_control, Field(json_schema_extra={"pattern": NAME_PATTERN})]
    ] = Field(
        default_factory=list, max_length=200
    )
    source_prefix: Name | None = None

    def to_filters(self) -> Filters | None:
        filters = Filters(tuple(self.modules), tuple(self.skill_points), tuple(self.doc_ids), self.source_prefix)
        return None if filters.is_empty() else filters


class RetrieveRequest(_Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={  # query variants are the fusion strategy's (the engine refuses them for another)
            "if": {"required": ["queries"], "properties": {"queries": {"type": "array", "minItems": 1}}},
            "then": {"required": ["strategy"], "properties": {"strategy": {"const": "fusion"}}},
        },
    )

    query: QueryText
    top_k: TopK = 5
    kb_ids: list[KbId] | None = Field(
        None, min_length=1, max_length=100, description="knowledge bases to search; default all you may read"
    )
    filters: FiltersIn | None = None
    rerank: bool | None = Field(None, description="false skips the reranker; default as configured")
    expand: bool = Field(True, description="expand the BM25 query through the synonym dictionary")
    explain: bool = Field(False, description="keep the per-document score trace")
    strategy: StrategyName | None = Field(  # type: ignore[valid-type]
        None, description="retrieval strategy; default as configured"
    )
    queries: list[QueryText] | None = Field(
        None, max_length=8, description="the fusion strategy's extra query variants"
    )
    deadline_ms: int | None = Field(
        None, ge=1, le=MAX_DEADLINE_MS,
        description="this request's time budget in milliseconds; the service's own (STRATA_RETRIEVAL__DEADLINE_MS) "
        "applies when it is shorter",
    )


class SkillRequest(_Strict):
    skill: Name
    query: QueryText | None = None
    top_k: TopK = 5
    kb_ids: list[KbId] | None = Field(None, min_length=1, max_length=100)
    explain: bool = False


class ModuleRequest(_Strict):
    module: Name
    query: QueryText | None = None
    top_k: TopK = 5
    kb_ids: list[KbId] | None = Field(None, min_length=1, max_length=100)
    level: Literal[1, 2, 3] = Field(1, description="chunk level listed when no query is given")
    explain: bool = False


class KbCreate(_Strict):
    kb_id: KbId


# -- the result: these mirror strata.types' records field for field, in their order ----------------
# The routes send ``RetrievalResult.to_dict()`` as it is; these models document that JSON (a test
# validates real answers against them and compares their fields with the dataclasses').


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DocumentOut(_Out):
    """One piece of evidence (``RetrievedDocument``)."""

    content: str = Field(description="the evidence text (a merged parent, a leaf or adjacent leaves joined)")
    score: float | None = Field(description="final score, higher is better; null when not finite or not ranked")
    metadata: dict[str, Any] = Field(
        description="chunk_id, doc_id, kb_id, version, level, heading_path, source, char_start, char_end, the "
        "document's own metadata and, with explain, the score trace"
    )


class MergeRoundOut(_Out):
    """What one auto-merge round did (``MergeRound``)."""

    round: int
    parents_merged: int
    children_replaced: int
    parents_missing: int


class RerankOutcomeOut(_Out):
    """Whether rerank ran, and why not when it did not (``RerankOutcome``)."""

    status: RerankStatus
    reason: str
    provider: str | None
    latency_ms: float | None


class StageErrorOut(_Out):
    """An error a stage recovered from or died of (``StageError``)."""

    stage: str
    error: str = Field(description="the error's type name, e.g. DeadlineExceeded")
    message: str


class RetrievalMetaOut(_Out):
    """How the evidence was found (``RetrievalMeta``): the record an engineer diagnoses with."""

    query: str
    top_k: int
    candidate_k: int = Field(description="fused candidates kept before merging and rerank")
    status: Status = Field(description="ok; degraded when a fallback answered (see degraded); failed")
    mode: Mode = Field(description="the routes that answered")
    kb_ids: list[str] | None = Field(description="knowledge bases searched; null = all")
    filters: dict[str, Any] = Field(description="the filters applied; {} for none")
    dense_candidates: int
    sparse_candidates: int
    fused_candidates: int
    merge_rounds: list[MergeRoundOut]
    rerank: RerankOutcomeOut
    returned: int
    dropped_by_min_score: int
    timings_ms: dict[str, float] = Field(description="milliseconds per stage")
    cache: CacheState = Field(description="query cache: hit, miss, shared (answered by a concurrent identical query), off")
    parent_cache: dict[str, Any] = Field(description="parent and leaf reads through the cache: hits and misses")
    errors: list[StageErrorOut]
    degraded: list[str] = Field(description="why the answer is degraded, one reason per fallback taken")
    strategy: str = Field(description="the retrieval strategy that ran")
    query_variants: list[str] = Field(description="the fusion strategy's query variants searched")
    expansion: dict[str, Any] = Field(description="terms the synonyms added to the BM25 query; {} for none")
    bm25_query: dict[str, Any] = Field(
        description="what BM25 query hygiene left out ({dropped, text, max_df}), {skipped: why}, or {}"
    )


class RetrieveResponse(_Out):
    """Exactly ``RetrievalResult.to_dict()``; ``metadata.trace`` only with ``explain``."""

    docs: list[DocumentOut]
    meta: RetrievalMetaOut


class SkillResponse(RetrieveResponse):
    skill: dict[str, Any]


class ModuleListingMetaOut(_Out):
    """The meta of a module listing (no query: the module's chunks in document order)."""

    status: Literal["ok"]
    mode: Literal["document_order"]
    top_k: int
    level: int
    kb_ids: list[str] | None
    returned: int


class ModuleResponse(RetrieveResponse):
    meta: RetrievalMetaOut | ModuleListingMetaOut  # type: ignore[assignment]
    module: dict[str, Any]


class KbOut(BaseModel):
    kb_id: str
    encoder: str
    dim: int
    generation: int


class KbList(BaseModel):
    kbs: list[KbOut]


class KbCreated(BaseModel):
    kb_id: str
    created: bool = Field(description="false when the knowledge base existed already (answered 200, not 201)")


class DocumentEntryOut(BaseModel):
    doc_id: str
    version: int
    source: str
    leaf_count: int
    chunk_count: int
    metadata: dict[str, Any]
    updated_at: str | None


class DocumentList(BaseModel):
    kb: str
    documents: list[DocumentEntryOut]


class ProblemOut(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    request_id: str | None

