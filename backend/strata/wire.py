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
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, PlainSerializer, TypeAdapter, WithJsonSchema

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
