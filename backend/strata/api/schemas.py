"""HTTP request and response schemas (pydantic lives here, at the edge only).

Strings reject control characters (a query may hold tabs and newlines) and
lone surrogates; unknown fields are refused, so the filter keys are an
allowlist. The limits that come from settings (``max_top_k``,
``max_query_chars``) are checked in the routes by the library's own check
(``RetrievalSettings.check_query``, the same message everywhere); the fields
they bound name their setting, and ``publish_limits`` writes the running
values into the OpenAPI document.

The answers' result and meta record are ``strata.types``' records themselves
(their JSON and schema come from ``strata.wire``); this module adds only what
the service answers beside them (a skill's or module's match, a module listing)
and the kb routes' answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StringConstraints
from pydantic.json_schema import SkipJsonSchema

from strata.config import RetrievalSettings
from strata.errors import InvalidArgumentError
from strata.strategy_table import StrategyName
from strata.types import Filters, RetrievalMeta, RetrievalResult, RetrievedDocument
from strata.wire import WIRE

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
            raise InvalidArgumentError(f"control character U+{ord(found.group()):04X} is not allowed")
        if not compiled.search(value):
            raise InvalidArgumentError(why)
        return value

    return AfterValidator(check)


_no_control = _matching(NAME_PATTERN, "control characters are not allowed")
_text = _matching(TEXT_PATTERN, "must not be blank")


QueryText = Annotated[
    str,
    StringConstraints(min_length=1),
    _text,
    Field(json_schema_extra={LIMIT_KEY: "max_query_chars", "pattern": TEXT_PATTERN}),
]
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512),
    _no_control,
    Field(json_schema_extra={"pattern": NAME_PATTERN}),
]
KbId = Annotated[str, StringConstraints(pattern=KB_ID_PATTERN)]


def _json_integer(value: Any) -> Any:
    """What the schema calls an integer and nothing else: pydantic alone would take ``true`` as 1 and ``"5"`` as 5.
    A number without a fractional part (``5.0``) is an integer to JSON Schema and stays accepted."""
    if isinstance(value, bool | str | bytes):
        raise InvalidArgumentError(f"must be an integer, not {type(value).__name__}")
    return value


# A bounded integer names its bounds before the validator (``Annotated[int, Field(ge=1), BeforeValidator(...)]``):
# bounds after a BeforeValidator would be published as unknown keys ("ge") instead of minimum/maximum.
Integer = Annotated[int, BeforeValidator(_json_integer)]
TopK = Annotated[Integer, Field(description="results wanted", json_schema_extra={"minimum": 1, LIMIT_KEY: "max_top_k"})]


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
    """A request body: unknown members refused; its integers ``Integer`` and its booleans ``StrictBool``."""

    model_config = ConfigDict(extra="forbid")


class FiltersIn(_Strict):
    """Restrictions of a search, ANDed; the only filter keys accepted."""

    modules: list[Name] = Field(default_factory=list, max_length=50)
    skill_points: list[Name] = Field(default_factory=list, max_length=50)
    doc_ids: list[
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=2048),
            _no_control,
            Field(json_schema_extra={"pattern": NAME_PATTERN}),
        ]
    ] = Field(default_factory=list, max_length=200)
    source_prefix: Name | None = None

    def to_filters(self) -> Filters | None:
        filters = Filters(tuple(self.modules), tuple(self.skill_points), tuple(self.doc_ids), self.source_prefix)
        return None if filters.is_empty() else filters


MAX_EVIDENCE_CHARS = 1_000_000


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
    rerank: StrictBool | None = Field(None, description="false skips the reranker; default as configured")
    expand: StrictBool = Field(True, description="expand the BM25 query through the synonym dictionary")
    explain: StrictBool = Field(False, description="keep the per-document score trace")
    strategy: StrategyName | None = Field(None, description="retrieval strategy; default as configured")
    queries: list[QueryText] | None = Field(
        None, max_length=8, description="the fusion strategy's extra query variants"
    )
    deadline_ms: Annotated[int, Field(ge=1, le=MAX_DEADLINE_MS), BeforeValidator(_json_integer)] | None = Field(
        None,
        description="this request's time budget in milliseconds; the service's own (STRATA_RETRIEVAL__DEADLINE_MS) "
        "applies when it is shorter",
    )
    max_chars: Annotated[int, Field(ge=1, le=MAX_EVIDENCE_CHARS), BeforeValidator(_json_integer)] | None = Field(
        None,
        description="at most this many characters of evidence: whole documents in rank order, the first that does "
        "not fit cut to the part that answered (metadata cut: true), the rest left out; default top_k whole documents",
    )


class SkillRequest(_Strict):
    skill: Name
    query: QueryText | None = None
    top_k: TopK = 5
    kb_ids: list[KbId] | None = Field(None, min_length=1, max_length=100)
    explain: StrictBool = False


class ModuleRequest(_Strict):
    module: Name
    query: QueryText | None = None
    top_k: TopK = 5
    kb_ids: list[KbId] | None = Field(None, min_length=1, max_length=100)
    level: Annotated[Literal[1, 2, 3], BeforeValidator(_json_integer)] = Field(
        1, description="chunk level listed when no query is given"
    )
    explain: StrictBool = False


class KbCreate(_Strict):
    kb_id: KbId


# -- answers: the result and its meta record are strata.types' records themselves (strata.wire) ---------


class SkillOut(BaseModel):
    """The skill's synonym group and the known skill points it named."""

    terms: list[str] = Field(description="the skill's synonym group, searched as the query when none is given")
    matched_skill_points: list[str] = Field(description="the known skill points of the group, used as a filter")
    filtered: bool = Field(description="whether the search was restricted to matched_skill_points")


class ModuleOut(BaseModel):
    """The known module closest to the one requested."""

    requested: str
    matched: str
    score: float = Field(description="similarity of the names, 0 to 1 (rounded to 3 places)")


@dataclass(frozen=True)
class SkillResponse(RetrievalResult):
    """A retrieval for a skill point: the result and the skill's match."""

    __pydantic_config__ = WIRE

    skill: SkillOut = field(kw_only=True)


@dataclass(frozen=True, kw_only=True)
class ModuleListingMeta:
    """The meta of a module listing (no query: the module's chunks in document order)."""

    __pydantic_config__ = WIRE

    status: Literal["ok"] = "ok"
    mode: Literal["document_order"] = "document_order"
    top_k: int
    level: int
    """the chunk level listed"""
    kb_ids: tuple[str, ...] | None
    """knowledge bases listed; null = all"""
    returned: int


@dataclass(frozen=True)
class ModuleResponse:
    """A module's chunks: ranked by a query (a result's meta record), or listed in document order."""

    __pydantic_config__ = WIRE

    docs: tuple[RetrievedDocument, ...]
    meta: RetrievalMeta | ModuleListingMeta
    module: ModuleOut


class KbOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # read from a ``KnowledgeBase`` record

    kb_id: str
    encoder: str
    dim: int
    generation: int


class KbList(BaseModel):
    kbs: list[KbOut]


class KbCreated(BaseModel):
    kb_id: str
    created: bool = Field(description="false when the knowledge base existed already (answered 200, not 201)")


def _isoformat(value: datetime | str | None) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else value


class DocumentEntryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)  # read from a ``DocumentEntry`` record

    doc_id: str
    version: int
    source: str
    leaf_count: int
    chunk_count: int
    metadata: dict[str, Any]
    updated_at: Annotated[str | None, BeforeValidator(_isoformat)] = Field(description="ISO 8601; null if unknown")


class DocumentList(BaseModel):
    kb: str
    documents: list[DocumentEntryOut]


class DocumentDeleted(BaseModel):
    kb: str
    deleted: str = Field(description="the document id deleted")


class ReadyOut(BaseModel):
    status: str = Field(
        description="ready; unavailable (503) when a required component is down, degraded (200) when another one is"
    )
    components: dict[str, dict[str, Any]] = Field(description="each component's status (up, down, off, ...)")


class ReadyDetailOut(BaseModel):
    status: str = Field(description="as /ready's")
    checked_s_ago: float = Field(description="seconds since the components were checked")
    components: dict[str, dict[str, Any]] = Field(description="each component's status, timing, error and details")


def _absent_when_unset(schema: dict[str, Any]) -> None:
    """A member some answers leave out (not ``null``): no ``default`` in its schema."""
    schema.pop("default", None)


class ProblemFieldError(BaseModel):
    """One field of a request that failed validation: where, and which rule (never the value sent)."""

    loc: list[str] = Field(description="the field's path: body, query or path first")
    msg: str
    type: str = Field(description="the rule's name (missing, string_too_long, ...)")


class ProblemOut(BaseModel):
    """An error answer (RFC 9457 ``application/problem+json``), with the request id and, for some problems,
    members of their own (``errors``, ``meta``)."""

    type: str = Field(description="the problem's URI (https://strata.dev/problems/<slug>)")
    title: str
    status: int
    detail: str
    request_id: str | None
    errors: list[ProblemFieldError] | SkipJsonSchema[None] = Field(
        None,
        description="a request that failed validation (422 invalid-input): each field's error",
        json_schema_extra=_absent_when_unset,
    )
    meta: RetrievalMeta | SkipJsonSchema[None] = Field(
        None,
        description="a retrieval that ran and failed (503 retrieval-failed, 504 deadline-exceeded): its meta record, "
        "whose status, errors and degraded reasons say why",
        json_schema_extra=_absent_when_unset,
    )
