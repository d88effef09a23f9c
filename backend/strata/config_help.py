"""What start-up says about a setting it refuses, and the names settings go by.

``strata.config`` defines the settings; this module explains a refusal of one: the line per invalid value
(``describe_validation_error``), the unknown ``STRATA_`` variable or strata.toml key with the setting it
nearly spells (``unknown_variable``, ``unknown_toml_key``, ``closest_setting``), a strata.toml tomllib cannot
read (``toml_problem``), and the ``STRATA_`` names that are no setting (``NOT_SETTINGS``). No message shows a
secret's value or an API key put where a name goes.

It knows the settings only as the model it is given (``root``: ``strata.config.Settings``), so ``config``
imports it and not the other way round. Part of the config layer: imports pydantic, the standard library,
``strata.errors`` and ``strata.key_grants`` only.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_origin

from pydantic import BaseModel, SecretStr, ValidationError

from strata.errors import ConfigError, KeyGrantError
from strata.key_grants import check_section_keys

Root = type[BaseModel]  # the settings model messages are about: ``strata.config.Settings``

ENV_PREFIX = "STRATA_"  # of every setting's variable: STRATA_<SECTION>__<FIELD>

# STRATA_ variables that are not settings, allowed beside them (any other unknown one stops start-up):
NOT_SETTINGS = frozenset(
    {
        "STRATA_CONFIG",  # the strata.toml to read (below)
        # deploy/compose.yml's own variables, interpolated into settings there (docs/deploy.md)
        "STRATA_API_KEY",
        "STRATA_COLLECTION",
        "STRATA_DEVICE",
        "STRATA_EMBEDDINGS_API_BASE",
        "STRATA_ENCODER",
        "STRATA_ENCODER_MODEL",
        "STRATA_IMAGE",
        "STRATA_MODELS_DIR",
        "STRATA_RERANK_URL",
        "STRATA_SLOTS_DIR",  # set by `strata serve --workers N` for its workers (strata.api.shared_slots)
    }
)
NOT_SETTINGS_PREFIX = (
    "STRATA_TEST_"  # the tests' own: STRATA_TEST_PG_URL, STRATA_TEST_PG_BIN, STRATA_TEST_MILVUS_URI ...
)
# Section names people reach for, and strata's: difflib alone would send STRATA_SQL__URL to STRATA_REDIS__URL.
_SECTION_ALIASES = {
    "SQL": "DATABASE",
    "DB": "DATABASE",
    "POSTGRES": "DATABASE",
    "POSTGRESQL": "DATABASE",
    "SQLITE": "DATABASE",
    "ENCODER": "EMBEDDING",
    "EMBEDDINGS": "EMBEDDING",
    "RERANKER": "RERANK",
    "CACHE": "REDIS",
}


# tomllib's messages that quote a table or key name, which under [api.keys] is an API key.
_TOML_NAMING = (
    "Cannot declare",
    "Cannot mutate immutable namespace",
    "Cannot redefine namespace",
    "Duplicate inline table key",
)


def toml_problem(exc: tomllib.TOMLDecodeError) -> str:
    """tomllib's message, without the name it quotes when a table or key is given twice."""
    message = str(exc)
    naming = next((start for start in _TOML_NAMING if message.startswith(start)), None)
    if naming is None:
        return message
    _, _, place = message.rpartition(" (at ")
    return f"{naming} … (a table or key defined twice{'; at ' + place[:-1] if place else ''})"


# A mapping setting whose names are API keys: an error below it is located at the setting itself.
_KEYS_LOC = ("api", "keys")


def variable_name(loc: tuple[Any, ...]) -> str:
    """The variable of the setting at ``loc``: ``("milvus", "uri")`` is ``STRATA_MILVUS__URI``."""
    loc = _KEYS_LOC if tuple(loc[:2]) == _KEYS_LOC else loc
    parts = [str(p) for p in loc if not str(p).isdigit()]
    return ENV_PREFIX + "__".join(p.upper() for p in parts) if parts else ENV_PREFIX + "*"


def _holds_secret(loc: tuple[Any, ...], root: Root) -> bool:
    """Whether ``loc`` is a secret setting (a ``SecretStr``, the API keys), whose input no message may show."""
    model: Any = root
    for depth, part in enumerate(loc):
        if tuple(loc[: depth + 1]) == _KEYS_LOC:
            return True
        field = model.model_fields.get(str(part)) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            return False
        if field.annotation is SecretStr:
            return True
        model = field.annotation
    return False


def describe_validation_error(exc: ValidationError, root: Root) -> str:
    """One line per invalid setting: ``STRATA_X__Y: reason (got 'value')``; a secret's value is never shown."""
    lines = []
    for err in exc.errors():
        got = err.get("input")
        shown = "" if isinstance(got, dict) or _holds_secret(err["loc"], root) else f" (got {got!r})"
        lines.append(f"{variable_name(err['loc'])}: {err['msg']}{shown}")
    return "invalid setting " + "; ".join(lines)


def _is_setting(path: Sequence[str], root: Root) -> bool:
    """Whether ``path`` (``["milvus", "uri"]``, any case) names a setting, a section, or a key under a mapping setting."""
    model: Any = root
    for depth, part in enumerate(path):
        field = model.model_fields.get(part.lower()) if model is not None else None
        if field is None:
            return False
        annotation = field.annotation
        if get_origin(annotation) is dict or annotation is dict:  # api.keys, milvus.analyzer: any key below
            return True
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
        if model is None and depth < len(path) - 1:
            return False
    return True


def _setting_names(separator: str, root: Root) -> list[str]:
    """Every setting as ``section<separator>field`` (or ``field`` at the top), upper case."""
    names = []
    for name, field in root.model_fields.items():
        section = (
            field.annotation if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) else None
        )
        names += [f"{name}{separator}{sub}".upper() for sub in section.model_fields] if section else [name.upper()]
    return names


def closest_setting(path: Sequence[str], root: Root, separator: str = "__") -> str | None:
    """The valid setting closest to ``path`` (difflib; a known alias of a section first), as ``A<separator>B``."""
    names = _setting_names(separator, root)
    parts = [p.upper() for p in path]
    if len(parts) > 1 and parts[0] in _SECTION_ALIASES:
        aliased = separator.join([_SECTION_ALIASES[parts[0]], *parts[1:]])
        if aliased in names:
            return aliased
    found = difflib.get_close_matches(separator.join(parts), names, n=1, cutoff=0.5)
    return found[0] if found else None


# pydantic-settings would read STRATA_API__KEYS__<key>__KBS as a grant: a key lowercased (so it never matches what
# clients send) and written where every listing of variables shows it.
KEYS_IN_NAME = (
    f"a variable {ENV_PREFIX}API__KEYS__… would put an API key in its name: give the keys as JSON in "
    f"{ENV_PREFIX}API__KEYS or in the file {ENV_PREFIX}API__KEYS_FILE"
)


# A word short enough to be a setting's name (a typo of one, STRATA_MILVUS__SHARDS) and too short for a key
# (MIN_KEY_CHARS: 16; a shorter one is warned about).
_NAME_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,14}")


def _shown_path(path: Sequence[str], root: Root) -> list[str]:
    """``path`` as far as a message may show it, then "…": the rest could be an API key put in a variable's name.

    Shown: settings' names and near misses of one, and in the first two places (a section and its field) any
    short word; a part below a field (where only a mapping's names, such as keys, can be) only if it is a setting.
    """
    shown: list[str] = []
    model: Any = root
    for depth, part in enumerate(path):
        name = _setting_at(model, part, root)
        if name is None and not (depth < 2 and _NAME_LIKE.fullmatch(part)):
            return [*shown, "…"]
        shown.append(part)
        annotation = model.model_fields[name].annotation if name else None
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    return shown


def _setting_at(model: Any, part: str, root: Root) -> str | None:
    """The field of ``model`` (a section, or None) that ``part`` names, is a known alias of, or nearly spells."""
    names = list(model.model_fields) if model is not None else []
    if model is root and part.upper() in _SECTION_ALIASES:
        return _SECTION_ALIASES[part.upper()].lower()
    if part.lower() in names:
        return part.lower()
    return next(iter(difflib.get_close_matches(part.lower(), names, n=1, cutoff=0.6)), None)


def unknown_variable(environ: Mapping[str, str], root: Root) -> str | None:
    """A line naming the first ``STRATA_`` variable that is no setting (with the closest one), or None.

    A variable naming an API key (``STRATA_API__KEYS__<key>__KBS``) is refused too; a name is shown only as far as
    it is made of settings' names (``_shown_path``).
    """
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in NOT_SETTINGS or upper.startswith(NOT_SETTINGS_PREFIX):
            continue
        path = upper[len(ENV_PREFIX) :].split("__")
        if path[:2] == ["API", "KEYS"] and len(path) > 2:
            return KEYS_IN_NAME
        if not _is_setting(path, root):
            closest = closest_setting(path, root)
            hint = f"; did you mean {ENV_PREFIX}{closest}?" if closest else ""
            shown = "__".join(_shown_path(name[len(ENV_PREFIX) :].split("__"), root))
            return f"unknown setting {ENV_PREFIX}{shown}{hint}"
    return None


def unknown_toml_key(data: Mapping[str, Any], source: str, root: Root) -> str | None:
    """A line naming the first key of a strata.toml that is no setting (with the closest one), or None."""
    for key, value in data.items():
        paths = [[key, sub] for sub in value] if isinstance(value, Mapping) and value else [[key]]
        for path in paths:
            if not _is_setting(path, root):
                closest = closest_setting(path, root, ".")
                hint = f"; did you mean {closest.lower()}?" if closest else ""
                return f"unknown setting {'.'.join(_shown_path(path, root))} in {source}{hint}"
    return None


def keys_of_api_json(environ: Mapping[str, str]) -> str | None:
    """A line on the keys of ``STRATA_API`` given whole as JSON, or None: pydantic-settings' ``json.loads`` would
    keep the last of a key given twice, so they are read here first, by position."""
    for name, value in environ.items():
        if name.upper() == f"{ENV_PREFIX}API":
            try:
                check_section_keys(value)
            except KeyGrantError as exc:
                return f"invalid setting {ENV_PREFIX}API: keys: {exc}"
    return None


def check_names(root: Root) -> None:
    """Unknown ``STRATA_`` variables (environment, ``.env``) and strata.toml keys stop start-up, naming the closest setting."""
    from dotenv import dotenv_values  # pydantic-settings' own .env reader

    dotenv = {k: v for k, v in dotenv_values(".env").items() if v is not None} if Path(".env").is_file() else {}
    environ = {**dotenv, **os.environ}
    problem = unknown_variable(environ, root) or keys_of_api_json(environ)
    toml_path = Path(os.environ.get(f"{ENV_PREFIX}CONFIG", "strata.toml"))
    if problem is None and toml_path.is_file():
        try:
            problem = unknown_toml_key(tomllib.loads(toml_path.read_text(encoding="utf-8")), str(toml_path), root)
        except tomllib.TOMLDecodeError:
            return  # reported by the settings source, with its place in the file
    if problem:
        raise ConfigError(problem)
