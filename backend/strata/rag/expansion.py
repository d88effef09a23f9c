"""Query expansion from a synonym dictionary (BM25 route only).

The dictionary maps a term to its synonyms (``Token管理: [Token, JWT, AccessToken]``),
read from a YAML or TOML file (``STRATA_RETRIEVAL__SYNONYMS``). A term and its
synonyms form one group; when any member occurs in a query, the members that
do not are appended to the BM25 text. The dense route keeps embedding the
original query, so expansion can only add keyword evidence, never move the
query's meaning.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from strata.config import ConfigError

SETTING = "STRATA_RETRIEVAL__SYNONYMS"


@dataclass(frozen=True)
class Expansion:
    """The BM25 text of a query and the terms expansion added to it."""

    bm25_text: str
    added_terms: tuple[str, ...]


@dataclass(frozen=True)
class SynonymDictionary:
    """Groups of interchangeable terms; lookups ignore case."""

    groups: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, Any]) -> SynonymDictionary:
        groups = []
        for term, synonyms in mapping.items():
            values = [synonyms] if isinstance(synonyms, str) else synonyms
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise ConfigError(f"{SETTING}: synonyms of {term!r} must be a string or a list of strings")
            members = [str(term).strip(), *(v.strip() for v in values)]
            groups.append(tuple(dict.fromkeys(m for m in members if m)))
        return cls(tuple(g for g in groups if g))

    def __bool__(self) -> bool:
        return bool(self.groups)

    def group_of(self, term: str) -> tuple[str, ...]:
        """Every member of the groups that hold ``term`` (itself first); ``(term,)`` when none does."""
        wanted = term.strip().casefold()
        found = [term.strip()]
        for group in self.groups:
            if any(m.casefold() == wanted for m in group):
                found.extend(group)
        return tuple(_unique_casefold(found))

    def expand(self, query: str) -> Expansion:
        """The query plus every synonym of a term it contains that it does not contain already."""
        added: list[str] = []
        for group in self.groups:
            if any(_occurs(m, query) for m in group):
                added.extend(m for m in group if not _occurs(m, query))
        added = _unique_casefold(added)
        return Expansion(" ".join([query, *added]) if added else query, tuple(added))


def expand(query: str, dictionary: SynonymDictionary) -> tuple[str, tuple[str, ...]]:
    """``(bm25_text, added_terms)`` of ``query``."""
    result = dictionary.expand(query)
    return result.bm25_text, result.added_terms


def load_synonyms(path: Path | None) -> SynonymDictionary:
    """The dictionary in a ``.yaml``/``.yml``/``.toml`` file; empty when ``path`` is None."""
    if path is None:
        return SynonymDictionary()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{SETTING}: cannot read {str(path)!r}: {exc}") from None
    try:
        data = tomllib.loads(text) if Path(path).suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{SETTING}: {str(path)!r} is not valid: {exc}") from None
    if data is None:
        return SynonymDictionary()
    if not isinstance(data, dict):
        raise ConfigError(f"{SETTING}: {str(path)!r} must map terms to lists of synonyms")
    return SynonymDictionary.from_mapping(data)


def _occurs(term: str, text: str) -> bool:
    """Case-insensitive; a term of word characters only matches whole words of ASCII text."""
    if term.isascii() and re.fullmatch(r"[\w\s.+-]+", term):
        return re.search(rf"(?<![A-Za-z0-9]){re.escape(term)}(?![A-Za-z0-9])", text, re.IGNORECASE) is not None
    return term.casefold() in text.casefold()


def _unique_casefold(terms: list[str]) -> list[str]:
    seen: dict[str, str] = {}
    for term in terms:
        seen.setdefault(term.casefold(), term)
    return list(seen.values())
