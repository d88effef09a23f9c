"""What a caller asks of a retrieval: one frozen ``RetrievalRequest``, defined once.

Every surface derives from this record, as every surface of a result derives from ``strata.types``:

- the library's calls (``retrieve_documents``, ``Retriever.retrieve``, ``aretrieve_documents``) take its fields
  as keywords (``takes_request_options`` publishes them in their signatures) and build it;
- the service's request bodies (``strata.api.schemas.RetrieveRequest``, and the by-skill and by-module
  requests that extend it) are generated from its fields, their wire constraints and their docstrings, and
  the routes hand the engine the record itself;
- both HTTP clients send its JSON (``request_body``);
- the query cache's key holds every field (``cache_fields``) except those ``CACHE_KEY_LEAVES_OUT`` names,
  each with the reason it cannot change a cached answer.

A new request option is one field here, with a default and a docstring, and one line in the test that
sets every field (``tests/test_request.py``): the library, the OpenAPI document, both clients and the
cache key then carry it, and a test fails for any surface that does not. What the engine does with it
is the engine's change.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from types import MappingProxyType
from typing import Annotated, Any, TypeVar, cast

from pydantic import BeforeValidator, Field, StrictBool

from strata.errors import InvalidArgumentError
from strata.strategy_table import StrategyName
from strata.types import Filters
from strata.wire import (
    MAX_DEADLINE_MS,
    MAX_EVIDENCE_CHARS,
    WIRE,
    KbId,
    QueryText,
    TopK,
    adapter,
    from_json,
    json_integer,
    to_json,
)

F = TypeVar("F", bound=Callable[..., Any])

QUERY_VARIANTS_NEED_FUSION: dict[
    str, Any
] = {  # query variants are the fusion strategy's (the engine refuses them for another)
    "if": {"required": ["queries"], "properties": {"queries": {"type": "array", "minItems": 1}}},
    "then": {"required": ["strategy"], "properties": {"strategy": {"const": "fusion"}}},
}

REQUEST_WIRE: dict[str, Any] = {**WIRE, "json_schema_extra": QUERY_VARIANTS_NEED_FUSION}


@dataclass(frozen=True)
class RetrievalRequest:
    """One retrieval's question and every option a caller can set.

    Built by the library's keywords, parsed from the service's request bodies and sent by the clients.
    Sequences are stored as tuples; empty filters are no filters. Limits that come from settings
    (``max_top_k``, ``max_query_chars``) and the engine's own checks are applied where it runs.
    """

    __pydantic_config__ = REQUEST_WIRE

    query: QueryText
    """the question; at most max_query_chars characters"""
    top_k: TopK = 5
    """results wanted"""
    _: KW_ONLY
    kb_ids: Annotated[Sequence[KbId], Field(min_length=1, max_length=100)] | None = None
    """knowledge bases to search; default all you may read"""
    filters: Filters | None = None
    """restrictions of the search, ANDed; default none"""
    rerank: StrictBool | None = None
    """false skips the reranker; default as configured"""
    expand: StrictBool = True
    """expand the BM25 query through the synonym dictionary"""
    strategy: StrategyName | None = None
    """retrieval strategy; default as configured"""
    queries: Annotated[Sequence[QueryText], Field(max_length=8)] | None = None
    """the fusion strategy's extra query variants"""
    deadline_ms: Annotated[int, Field(ge=1, le=MAX_DEADLINE_MS), BeforeValidator(json_integer)] | None = None
    """this request's time budget in milliseconds; the service's own (STRATA_RETRIEVAL__DEADLINE_MS) applies when
    it is shorter"""
    max_chars: Annotated[int, Field(ge=1, le=MAX_EVIDENCE_CHARS), BeforeValidator(json_integer)] | None = None
    """at most this many characters of evidence: whole documents in rank order, the first that does not fit cut to
    the part that answered (metadata cut: true), the rest left out; default top_k whole documents"""

    def __post_init__(self) -> None:
        if isinstance(self.kb_ids, str):
            raise InvalidArgumentError("kb_ids must be a list of knowledge base ids, not a string")
        if isinstance(self.queries, str):
            raise InvalidArgumentError("queries must be a list of query variants, not a string")
        for name in ("kb_ids", "queries"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if self.filters is not None and self.filters.is_empty():
            object.__setattr__(self, "filters", None)

    def to_dict(self) -> dict[str, Any]:
        """Every field as JSON (the wire form)."""
        return to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetrievalRequest:
        """The inverse of ``to_dict``, checked against the wire constraints (``pydantic.ValidationError``)."""
        return from_json(cls, data)


def option_names() -> tuple[str, ...]:
    """Every field's name, in order."""
    return tuple(f.name for f in fields(RetrievalRequest))


def request_of(record: RetrievalRequest | Any, **changes: Any) -> RetrievalRequest:
    """The ``RetrievalRequest`` that ``record`` (any object with the record's fields: a request body) holds, with
    ``changes``."""
    values = {name: getattr(record, name) for name in option_names()}
    return RetrievalRequest(**{**values, **changes})


def request_body(request: RetrievalRequest) -> dict[str, Any]:
    """The JSON a client sends: the fields away from their defaults (a service of an older version knows every
    field a caller leaves unset)."""
    body: dict[str, Any] = adapter(RetrievalRequest).dump_python(request, mode="json", exclude_defaults=True)
    return body


# -- the query cache's key -----------------------------------------------------------------------------------------

CACHE_KEY_LEAVES_OUT: Mapping[str, str] = MappingProxyType(
    {
        "deadline_ms": "a deadline decides whether an answer arrives in time, never which answer: only runs that "
        "ended ok are cached",
        "max_chars": "applied to the result after the cache lookup (``Retriever._within``): one entry serves every "
        "budget",
    }
)
"""The fields a query-cache key leaves out, each with why it cannot change a cached answer. Every other field is in
the key: a new option is in it unless it is named here."""


def cache_fields(request: RetrievalRequest) -> dict[str, Any]:
    """The request's half of a query-cache key: every field as JSON, but those ``CACHE_KEY_LEAVES_OUT`` names."""
    data = adapter(RetrievalRequest).dump_python(request, mode="json")
    return {name: value for name, value in data.items() if name not in CACHE_KEY_LEAVES_OUT}


# -- the library's signatures ----------------------------------------------------------------------------------------


def keyword_options() -> list[inspect.Parameter]:
    """The record's keyword-only fields as keyword-only parameters, with their defaults and types (without their
    wire constraints)."""
    types = typing.get_type_hints(RetrievalRequest)
    record = inspect.signature(RetrievalRequest).parameters.values()
    kw_only = inspect.Parameter.KEYWORD_ONLY
    return [p.replace(annotation=types[p.name]) for p in record if p.kind is kw_only]


def takes_request_options(function: F) -> F:
    """``function`` with its ``**options`` published as the record's options (``inspect.signature``, ``help``).

    ``function`` takes ``query`` and ``top_k`` itself, then keywords of its own, and ``**options`` that it passes
    on to ``RetrievalRequest``, which refuses an unknown one (``TypeError``, as a Python call does)."""
    signature = inspect.signature(function)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    leading = [p for p in own if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    trailing = [p for p in own if p.kind is inspect.Parameter.KEYWORD_ONLY]
    cast(Any, function).__signature__ = signature.replace(parameters=[*leading, *keyword_options(), *trailing])
    return function
