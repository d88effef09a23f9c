"""The OpenAPI document as the service really answers: its limits, its key, its error answers.

FastAPI writes the document from the routes and schemas; this adds what the
middleware and settings decide: the running limits (``max_top_k``,
``max_query_chars``), the bearer scheme on every route that needs a key, and
the problem answers each route can give. A route lists the errors it raises
itself (``problems(403, 409)``); those the middleware answers are added here
from what the route is: 400 on every route (a request line or header the
server cannot parse: ``strata.api.malformed``; on a route with a body, one
that cannot be parsed at all), 401 and 503 (busy, a store down) on a route
that needs a key, 408 and 413 on one with a body, 422 on one with parameters.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import Any

from pydantic import BaseModel

from strata.api.problems import MEDIA_TYPE
from strata.api.schemas import ProblemOut, publish_limits
from strata.config import RetrievalSettings

SCHEME = "bearer"
REF_TEMPLATE = "#/components/schemas/{model}"
PROBLEM_REF = {"$ref": REF_TEMPLATE.format(model=ProblemOut.__name__)}
_METHODS = ("get", "put", "post", "delete", "patch")


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` of a route for errors it answers as problem documents."""
    return {code: _problem(code) for code in codes}


def _problem(code: int) -> dict[str, Any]:
    return {"description": HTTPStatus(code).phrase, "content": {MEDIA_TYPE: {"schema": PROBLEM_REF}}}


def complete(doc: dict[str, Any], retrieval: RetrievalSettings, protected: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """``doc`` with limits, security and the middleware's problem answers; ``protected`` are (path, method) pairs."""
    publish_limits(doc, retrieval)
    components = doc.setdefault("components", {})
    _add_schema(components.setdefault("schemas", {}), ProblemOut)
    components["securitySchemes"] = {
        SCHEME: {
            "type": "http",
            "scheme": "bearer",
            "description": "an API key (STRATA_API__KEYS or STRATA_API__API_KEY)",
        }
    }
    keyed = {(path, method.lower()) for path, method in protected}
    for path, operations in doc.get("paths", {}).items():
        for method, operation in operations.items():
            if method in _METHODS:
                _complete_operation(operation, needs_key=(path, method) in keyed)
    return doc


def _add_schema(schemas: dict[str, Any], model: type[BaseModel]) -> None:
    """``model``'s schema among the document's ``schemas``, with the records it refers to (``RetrievalMeta`` of a
    failed retrieval's problem) beside it: those the routes' answers published already are kept as they are."""
    schema = model.model_json_schema(ref_template=REF_TEMPLATE, mode="serialization")  # as FastAPI's answers
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas[model.__name__] = schema


def _complete_operation(operation: dict[str, Any], *, needs_key: bool) -> None:
    codes = {400}  # a request the server cannot parse: a path of raw non-ASCII bytes, a body of no JSON at all
    if needs_key:
        operation["security"] = [{SCHEME: []}]
        codes |= {401, 503}
    if "requestBody" in operation:
        codes |= {408, 413, 422}
    if operation.get("parameters"):
        codes.add(422)
    responses = operation.setdefault("responses", {})
    for code in sorted(codes):
        responses.setdefault(str(code), _problem(code))
    validation = responses.get("422", {}).get("content", {})
    if "application/json" in validation:  # FastAPI's own 422 schema: the service answers a problem document
        responses["422"] = _problem(422)
