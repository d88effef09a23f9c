"""The JSON shape of strata's records, read from their one definition (the dataclasses of ``strata.types``).

A pydantic ``TypeAdapter`` over a frozen stdlib dataclass gives its JSON (``to_json``), its parsing
(``from_json``: lists back to tuples, unknown fields ignored, missing ones at their defaults) and
its JSON Schema, which the service publishes in its OpenAPI document. The records stay plain
dataclasses that the engine builds and copies with ``replace``; pydantic only reads their
annotations, their attribute docstrings (the fields' descriptions) and ``WIRE``.

Values JSON cannot hold serialise as they always have: a non-finite float (a NaN score: not
ranked) is ``null`` and reads back as NaN; a free-form mapping (a document's metadata, the meta
record's filters, cache counts, expansion) is made JSON-safe (``json_safe``): keys become
strings, tuples and sets lists, anything else not JSON its ``str``.

A request's fields carry their wire constraints here too (``QueryText``, ``Name``, ``KbId``, ``TopK``,
``Integer``): the bounds a client reads in the OpenAPI document, checked where a body is parsed. They are
``Annotated`` metadata, inert for the engine that builds the records directly.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    StringConstraints,
    TypeAdapter,
    WithJsonSchema,
)

from strata.errors import InvalidArgumentError

T = TypeVar("T")

WIRE: dict[str, Any] = {"use_attribute_docstrings": True, "json_schema_serialization_defaults_required": True}
"""The pydantic config of every record on the wire (``__pydantic_config__``): descriptions from the attribute
docstrings, and every field listed as present in an answer's schema (defaults are sent too)."""


def json_float(value: float) -> float | None:
    """``value``, or None when it is not finite (JSON has no NaN or infinity)."""
    return value if math.isfinite(value) else None


def json_safe(value: Any) -> Any:
    """``value`` made of JSON types only: floats as ``json_float``, mappings with string keys, sequences and
    sets as lists, anything else as its ``str``."""
    if isinstance(value, float):
        return json_float(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _nan_for_null(value: Any) -> Any:
    return math.nan if value is None else value


JsonFloat = Annotated[
    float,
    BeforeValidator(_nan_for_null),
    PlainSerializer(json_float, return_type=Any, when_used="json"),  # Any: an int stays an int, as json.dumps wrote it
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "null"}]}),
]
"""A float that is ``null`` on the wire when it is not finite, and NaN again when read."""

JsonMapping = Annotated[Mapping[str, Any], PlainSerializer(json_safe, return_type=dict[str, Any], when_used="json")]
"""A free-form mapping, made JSON-safe on the wire (``json_safe``)."""


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def adapter(record_type: type[T]) -> TypeAdapter[T]:
    """The pydantic adapter of a record type (built on first use): its JSON, its parsing and its JSON Schema."""
    found = _ADAPTERS.get(record_type)
    return found if found is not None else _ADAPTERS.setdefault(record_type, TypeAdapter(record_type))


def to_json(record: Any) -> dict[str, Any]:
    """``record`` as JSON-ready Python data (the wire format)."""
    data: dict[str, Any] = adapter(type(record)).dump_python(record, mode="json")
    return data


def from_json(record_type: type[T], data: Any) -> T:
    """The record of ``record_type`` that ``data`` (parsed JSON) describes; ``pydantic.ValidationError`` (a
    ``ValueError``) when it describes none."""
    return adapter(record_type).validate_python(data)


# -- what a request's fields accept ------------------------------------------------------------------------------

LIMIT_KEY = "x-strata-limit"  # OpenAPI extension: the setting whose running value bounds the field
MAX_DEADLINE_MS = 3_600_000  # a bound for the schema only: the service's own deadline caps it long before
MAX_EVIDENCE_CHARS = 1_000_000
KB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"

_CONTROL = r"\u0000-\u001f\u007f-\u009f"  # Cc, as ranges Python's re and JSON Schema both read
_TEXT_CONTROL = r"\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f"  # the same, tabs and newlines allowed
_SURROGATES = r"\ud800-\udfff"  # lone surrogates (Cs) are refused too; the published pattern leaves them out, as
# schemathesis drops a pattern that names them, and a JSON text decodes to them only from a lone \uD8xx escape
NAME_PATTERN = rf"^[^{_CONTROL}]*$"
TEXT_PATTERN = rf"^[^{_TEXT_CONTROL}]*[^\s{_TEXT_CONTROL}][^{_TEXT_CONTROL}]*$"  # not blank either
SUBJECT_PATTERN = rf"^[^{_CONTROL}]*[^\s{_CONTROL}][^{_CONTROL}]*$"  # a name that is not blank


def matching(pattern: str, why: str) -> AfterValidator:
    """The check of ``pattern`` by Python's ``re``, which the OpenAPI document publishes (pydantic's own
    ``pattern`` is another regex engine, one without lone surrogates)."""
    compiled = re.compile(pattern)
    controls = _TEXT_CONTROL if _TEXT_CONTROL in pattern else _CONTROL
    refused = re.compile(f"[{controls}{_SURROGATES}]")

    def check(value: str) -> str:
        found = refused.search(value)
        if found:
            raise InvalidArgumentError(f"control character U+{ord(found.group()):04X} is not allowed")
        if not compiled.search(value):
            raise InvalidArgumentError(why)
        return value

    return AfterValidator(check)


no_control = matching(NAME_PATTERN, "control characters are not allowed")

QueryText = Annotated[
    str,
    StringConstraints(min_length=1),
    matching(TEXT_PATTERN, "must not be blank"),
    Field(json_schema_extra={LIMIT_KEY: "max_query_chars", "pattern": TEXT_PATTERN}),
]
"""A query: not blank, no control characters but tabs and newlines; at most ``max_query_chars`` (a setting)."""
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512),
    no_control,
    Field(json_schema_extra={"pattern": NAME_PATTERN}),
]
"""A name (a module, a skill point, a source prefix): 1 to 512 characters, no control characters."""
Subject = Annotated[
    str,
    StringConstraints(min_length=1, max_length=512),
    matching(SUBJECT_PATTERN, "must not be blank"),
    Field(json_schema_extra={"pattern": SUBJECT_PATTERN}),
]
"""The skill or module a route searches for: a ``Name`` that is not blank, since it is the query when none is
given (a blank one passed the schema and was then refused as a query)."""
KbId = Annotated[str, StringConstraints(pattern=KB_ID_PATTERN)]


def json_integer(value: Any) -> Any:
    """What the schema calls an integer and nothing else: pydantic alone would take ``true`` as 1 and ``"5"`` as 5.
    A number without a fractional part (``5.0``) is an integer to JSON Schema and stays accepted."""
    if isinstance(value, bool | str | bytes):
        raise InvalidArgumentError(f"must be an integer, not {type(value).__name__}")
    return value


# A bounded integer names its bounds before the validator (``Annotated[int, Field(ge=1), BeforeValidator(...)]``):
# bounds after a BeforeValidator would be published as unknown keys ("ge") instead of minimum/maximum.
Integer = Annotated[int, BeforeValidator(json_integer)]
TopK = Annotated[Integer, Field(json_schema_extra={"minimum": 1, LIMIT_KEY: "max_top_k"})]
"""Results wanted: at least 1, at most ``max_top_k`` (a setting)."""
