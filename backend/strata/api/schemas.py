"""HTTP request and response schemas (pydantic lives here, at the edge only).

The retrieval request bodies hold the fields of ``strata.request.RetrievalRequest`` (``with_request_fields``:
their wire types, defaults and docstrings come from the record) and what each route adds. Strings reject
control characters (a query may hold tabs and newlines) and lone surrogates (``strata.wire``); unknown fields
are refused, so the filter keys are an allowlist. The limits that come from settings (``max_top_k``,
``max_query_chars``) are checked in the routes by the library's own check (``RetrievalSettings.check_query``,
the same message everywhere); the fields they bound name their setting, and ``publish_limits`` writes the
running values into the OpenAPI document.

The answers' result and meta record are ``strata.types``' records themselves
(their JSON and schema come from ``strata.wire``); this module adds only what
the service answers beside them (a skill's or module's match, a module listing)
and the kb routes' answers.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StringConstraints, create_model
from pydantic.json_schema import SkipJsonSchema

from strata.config import RetrievalSettings
from strata.request import QUERY_VARIANTS_NEED_FUSION, RetrievalRequest, request_of
from strata.types import Filters, RetrievalMeta, RetrievalResult, RetrievedDocument
from strata.wire import KB_ID_PATTERN as KB_ID_PATTERN  # the request fields' wire constraints are strata.wire's
from strata.wire import LIMIT_KEY, NAME_PATTERN, WIRE, KbId, Name, QueryText, Subject, adapter, json_integer, no_control

LIMITS = {"max_query_chars": "maxLength", "max_top_k": "maximum"}  # setting -> JSON Schema keyword
_no_control, _json_integer = no_control, json_integer


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


def filters_without(name: str) -> type[FiltersIn]:
    """``FiltersIn`` whose filter ``name`` must be empty, for a route that sets it itself: the route's schema says so
    (at most 0 items), so a body that sets it is refused by the schema, never after it (a schema-valid body is not
    refused), and a request's whole wire form, which lists every filter, empty ones too, is still taken."""
    title = "".join(part.title() for part in name.split("_"))
    own: Any = Field(default_factory=list, max_length=0, description="set by the route: leave it empty")
    fields: dict[str, Any] = {name: (list[Name], own)}
    return create_model(
        f"FiltersBut{title}",
        __base__=FiltersIn,
        __module__=__name__,
        __doc__=f"{FiltersIn.__doc__} The route sets ``{name}`` itself.",
        **fields,
    )


SkillFilters = filters_without("skill_points")
ModuleFilters = filters_without("modules")


# -- retrieval requests: the fields of strata.request.RetrievalRequest, and what a route adds ---------------------

EDGE_TYPES: dict[str, Any] = {"filters": FiltersIn | None}
"""A record field whose wire type the edge checks more closely than the record's own (unknown filter keys are
refused, names bounded); every other field's wire type is the record's."""

Body = TypeVar("Body", bound="RequestBody")


class RequestBody(_Strict):
    """A request body that holds a ``RetrievalRequest``'s fields (``with_request_fields``) and what its route adds."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=QUERY_VARIANTS_NEED_FUSION)

    def to_request(self, **changes: Any) -> RetrievalRequest:
        """The ``RetrievalRequest`` this body holds, with ``changes`` (a route's own query or filters)."""
        filters = getattr(self, "filters", None)
        wire = {"filters": filters.to_filters() if isinstance(filters, FiltersIn) else filters}
        return request_of(self, **{**wire, **changes})


def with_request_fields(body: type[Body]) -> type[Body]:
    """``body`` (a ``RequestBody`` declaring its route's own fields) with every field of ``RetrievalRequest`` it does
    not declare itself: the record's wire type (or ``EDGE_TYPES``'), default and docstring. A field added to the
    record is in every request body and the OpenAPI document without a change here."""
    hints = typing.get_type_hints(RetrievalRequest, include_extras=True)
    described = adapter(RetrievalRequest).json_schema()["properties"]
    added: dict[str, Any] = {}
    for spec in dataclasses.fields(RetrievalRequest):
        if spec.name in body.model_fields:
            continue
        default = ... if spec.default is dataclasses.MISSING else spec.default
        wire_type = EDGE_TYPES.get(spec.name, hints[spec.name])
        description = " ".join(described[spec.name].get("description", "").split()) or None
        added[spec.name] = (wire_type, Field(default, description=description))
    return create_model(body.__name__, __base__=body, __module__=body.__module__, __doc__=body.__doc__, **added)


@with_request_fields
class RetrieveRequest(RequestBody):
    """A retrieval: the fields of the library's ``RetrievalRequest``, and ``explain``."""

    explain: StrictBool = Field(False, description="keep the per-document score trace")


@with_request_fields
class SkillRequest(RequestBody):
    """A retrieval for a skill point: its synonym group is the query when none is given, and the known skill points
    it names are the ``skill_points`` filter (its ``filters.skill_points`` must be empty: the route sets them)."""

    skill: Subject
    filters: SkillFilters | None = Field(None, description="the other filters, ANDed with the skill's")  # type: ignore[valid-type]
    query: QueryText | None = Field(None, description="default the skill's synonym group")
    explain: StrictBool = False


@with_request_fields
class ModuleRequest(RequestBody):
    """A module's chunks: ranked by ``query`` (the closest known module is the ``modules`` filter; its
    ``filters.modules`` must be empty: the route sets them), or without one listed in document order (``top_k``, ``kb_ids``,
    ``level`` and ``max_chars`` apply)."""

    module: Subject
    filters: ModuleFilters | None = Field(None, description="the other filters, ANDed with the module's")  # type: ignore[valid-type]
    query: QueryText | None = Field(None, description="default none: the module's chunks in document order")
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
