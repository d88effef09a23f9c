"""A safe builder of Milvus boolean filter expressions.

Every value is written as an escaped string/number literal and every field
name comes from an allowlist, so user input (a module name, a doc id, a
source prefix) can never change the structure of the expression.
``filter_params`` templating is not used: Milvus Lite rejects it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from strata.errors import InvalidArgumentError
from strata.types import Filters

STRING_FIELDS = frozenset({"kb_id", "doc_id", "version_key", "parent_id", "root_id", "module", "source", "chunk_id"})
INT_FIELDS = frozenset({"version", "level", "ordinal"})
ARRAY_FIELDS = frozenset({"skill_points"})

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}
# LIKE wildcards; Milvus Lite has no escape for them inside a LIKE pattern.
LIKE_WILDCARDS = frozenset("%_")


def quote(value: str) -> str:
    """A double-quoted Milvus string literal that reads back as ``value``."""
    if not isinstance(value, str):  # ``Filters``' fields are typed (and the API's schema checks them): a caller's bug
        raise TypeError(f"filter value must be a string, got {type(value).__name__}")
    if "\x00" in value:
        raise InvalidArgumentError("filter value must not contain NUL characters")
    return '"' + "".join(_ESCAPES.get(ch, ch) for ch in value) + '"'


def _literal(field: str, value: object) -> str:
    if field in INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int):  # strata's own expressions only: a bug
            raise TypeError(f"{field} takes an integer, got {value!r}")
        return str(value)
    return quote(value)  # type: ignore[arg-type]


def _field(name: str, allowed: Iterable[str] = STRING_FIELDS | INT_FIELDS) -> str:
    if name not in allowed:  # field names come from strata's code, never from a caller: a bug, not input
        raise ValueError(f"field {name!r} cannot be filtered on")
    return name


def eq(field: str, value: str | int) -> str:
    return f"{_field(field)} == {_literal(field, value)}"


def in_(field: str, values: Sequence[str | int]) -> str:
    if not values:  # callers build a clause only for values they have (``filters_expression``): a bug, not input
        raise ValueError(f"{field} in [] matches nothing; refuse to build it")
    return f"{_field(field)} in [{', '.join(_literal(field, v) for v in values)}]"


def not_in(field: str, values: Sequence[str | int]) -> str:
    return f"not ({in_(field, values)})"


def array_contains_any(field: str, values: Sequence[str]) -> str:
    if not values:  # as in ``in_``: a bug, not input
        raise ValueError(f"{field} contains none of [] matches nothing")
    return f"array_contains_any({_field(field, ARRAY_FIELDS)}, [{', '.join(quote(v) for v in values)}])"


def starts_with(field: str, prefix: str) -> str:
    """``field like "prefix%"``; wildcards inside ``prefix`` over-match (see ``needs_exact_check``)."""
    return f"{_field(field, STRING_FIELDS)} like {quote(prefix + '%')}"


def needs_exact_check(prefix: str) -> bool:
    """True when a LIKE prefix contains wildcards, so hits must be re-checked in Python."""
    return any(ch in LIKE_WILDCARDS for ch in prefix)


def all_of(*clauses: str | None) -> str:
    """AND of the non-empty clauses, each parenthesized; "" when none."""
    parts = [c for c in clauses if c]
    if len(parts) == 1:
        return parts[0]
    return " and ".join(f"({c})" for c in parts)


def filters_expression(filters: Filters | None) -> str:
    """The expression of a user ``Filters`` (module, skill point, doc ids, source prefix)."""
    if filters is None or filters.is_empty():
        return ""
    return all_of(
        in_("module", filters.modules) if filters.modules else None,
        array_contains_any("skill_points", filters.skill_points) if filters.skill_points else None,
        in_("doc_id", filters.doc_ids) if filters.doc_ids else None,
        starts_with("source", filters.source_prefix) if filters.source_prefix else None,
    )
