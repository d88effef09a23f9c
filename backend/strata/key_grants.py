"""API keys as configured, read so that no message ever shows one.

``STRATA_API__KEYS`` (JSON), ``STRATA_API__KEYS_FILE`` and a strata.toml's
``[api.keys]`` map each key to its grant. A key is a secret that sits where
settings put names: pydantic would report a bad grant at the location
``api.keys.<the key>`` with its input, and ``json.loads`` keeps the last of two
equal keys without a word. So grants are read here, in order: a key is named
by its position ("key #3 is the same key as key #1"), a grant's field only when it is a
known one or a near miss of one (else it could be a key nested by a misplaced
brace), and no input that is text is ever echoed.

Part of the config layer: imports pydantic, the standard library and ``strata.errors`` only.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import PydanticCustomError

from strata.errors import KeyGrantError

__all__ = ["ApiKeyGrant", "check_section_keys", "pydantic_error", "read_grants"]


class ApiKeyGrant(BaseModel):
    """What one API key may do: read these kbs ("*" = all), write only with ``write``."""

    model_config = {"extra": "forbid"}

    kbs: list[str] = Field(default_factory=list)
    write: bool = False
    metrics: bool = Field(False, description="may read /metrics (every tenant's activity); the full-access key may too")


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as its (name, value) pairs in order, so that a repeated name is seen, not dropped."""


def read_grants(value: object) -> dict[str, ApiKeyGrant]:
    """``value`` (JSON text, or a mapping from TOML or code) as key -> grant, in order.

    Raises ``KeyGrantError`` naming a bad or repeated key by its position, never by its value.
    """
    grants: dict[str, ApiKeyGrant] = {}
    first: dict[str, int] = {}
    for n, (key, grant) in enumerate(_pairs(value), 1):
        if not isinstance(key, str):
            raise KeyGrantError(f"key #{n} is not a string")
        if key in first:
            raise KeyGrantError(f"key #{n} is the same key as key #{first[key]}: define each key once")
        first[key] = n
        grants[key] = _grant(grant, f"key #{n}")
    return grants


def check_section_keys(text: str) -> None:
    """The ``keys`` of a whole section given as JSON (``STRATA_API='{"keys": {...}}'``), checked as ``read_grants``
    checks them; text that is no JSON object is left to the settings loader to report."""
    try:
        section = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError:
        return
    for name, value in section if isinstance(section, _Pairs) else ():
        if name == "keys":
            read_grants(value)


def pydantic_error(exc: KeyGrantError) -> PydanticCustomError:
    """``exc`` for a pydantic validator: reported as its message alone, at the setting's location."""
    return PydanticCustomError("api_keys", str(exc))  # without a context the message is not formatted


def _pairs(value: object) -> Iterable[tuple[Any, Any]]:
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value, object_pairs_hook=_Pairs)
        except json.JSONDecodeError as exc:  # its message is a position, never the text
            raise KeyGrantError(f"not valid JSON: {exc}") from None
    if isinstance(value, _Pairs):
        return value
    if isinstance(value, Mapping):
        return value.items()
    raise KeyGrantError(f'must be a JSON object {{"<key>": {{"kbs": [...]}}}}, got {_kind(value)}')


def _grant(value: object, where: str) -> ApiKeyGrant:
    if isinstance(value, ApiKeyGrant):
        return value
    if not isinstance(value, (_Pairs, Mapping)):
        raise KeyGrantError(f'{where}: its grant must be an object like {{"kbs": ["kb1"]}}, got {_kind(value)}')
    fields = list(value.items() if isinstance(value, Mapping) else value)
    names = [name for name, _ in fields]
    for n, name in enumerate(names):
        if name in names[:n]:
            raise KeyGrantError(f"{where}: {_shown_field(name)} is given twice")
    try:
        return ApiKeyGrant.model_validate(_plain(dict(fields)))
    except ValidationError as exc:
        raise KeyGrantError(f"{where}: " + "; ".join(_problem(err) for err in exc.errors())) from None


def _plain(value: Any) -> Any:
    """Nested ``_Pairs`` (an object inside a grant) as dicts, for pydantic to refuse with its usual message."""
    if isinstance(value, _Pairs):
        return {name: _plain(inner) for name, inner in value}
    if isinstance(value, dict):
        return {name: _plain(inner) for name, inner in value.items()}
    return [_plain(item) for item in value] if isinstance(value, list) else value


def _problem(err: Any) -> str:
    loc: tuple[Any, ...] = err.get("loc") or ()
    name = _shown_field(loc[0]) if loc else "the grant"
    if err.get("type") == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[0]).lower(), list(ApiKeyGrant.model_fields), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{name} is not a grant field ({', '.join(ApiKeyGrant.model_fields)}){hint}"
    got = err.get("input")
    shown = "" if isinstance(got, str) else f" (got {_kind(got)})"  # text could be a key in the wrong place
    return f"{name}: {err['msg']}{shown}"


def _shown_field(name: object) -> str:
    """A grant field's name if it is one or a near miss of one ('kbz'); any other name could be a key."""
    known = list(ApiKeyGrant.model_fields)
    if isinstance(name, str) and (name in known or difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.6)):
        return repr(name)
    return "a field (a key inside another key's grant? check the braces)"


def _kind(value: object) -> str:
    """What ``value`` is without its text: a number or boolean as itself, anything else by its JSON type."""
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)
    kinds = {list: "an array", dict: "an object", str: "a string"}
    return next((kind for cls, kind in kinds.items() if isinstance(value, cls)), f"a {type(value).__name__}")
