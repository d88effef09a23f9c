"""What fits the leaf collection's schema, and the BM25 analyzer's user dictionary (pure).

``leaf_limit_violation`` checks a leaf against the schema's size limits
before a write, so one oversized value fails one document, not a write group.
``analyzer_with_dictionary`` puts front-matter terms (modules, skill points)
into the jieba analyzer of a new collection so they stay one token.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from strata.types import Chunk

# The schema's size limits, checked before a write so one oversized value fails one document, not the
# whole write group. Lengths are UTF-8 bytes: Milvus Lite counts characters, a Milvus server bytes, and
# a knowledge base must move from one to the other.
LIMITS = {
    "kb_id": 256,
    "doc_id": 2048,
    "heading_path": 4096,
    "module": 512,
    "source": 2048,
    "skill_point": 512,
    "skill_points": 256,
    "content": 65535,
    "text": 65535,
}


def analyzer_with_dictionary(analyzer: dict[str, Any], terms: Iterable[str]) -> dict[str, Any]:
    """The jieba analyzer with ``terms`` added to its user dictionary, so "两步验证" is a token of its own.

    ``{"tokenizer": "jieba"}`` becomes jieba in ``search`` mode (a whole term and its parts are both
    tokens); a jieba tokenizer given as a dict keeps its own mode. Other analyzers, or no terms, are
    returned as configured.
    """
    words = sorted(dictionary_terms(terms))
    tokenizer = analyzer.get("tokenizer")
    if not words:
        return analyzer
    if tokenizer == "jieba":
        tokenizer = {"type": "jieba", "mode": "search", "hmm": True}
    if not isinstance(tokenizer, dict) or tokenizer.get("type") != "jieba":
        return analyzer
    known = [w for w in tokenizer.get("dict", ["_default_"]) if w not in words]
    return {**analyzer, "tokenizer": {**tokenizer, "dict": [*known, *words]}}


def analyzer_identity(params: Mapping[str, Any]) -> dict[str, Any]:
    """What decides an analyzer's tokens, as a setting names it: without the user dictionary
    ``analyzer_with_dictionary`` adds, and with ``"jieba"`` standing for the search-mode jieba it expands to."""
    tokenizer = params.get("tokenizer")
    if isinstance(tokenizer, Mapping):
        tokenizer = {k: v for k, v in tokenizer.items() if k != "dict"}
        if tokenizer in ({"type": "jieba", "mode": "search", "hmm": True}, {"type": "jieba"}):
            tokenizer = "jieba"
    return {**params, "tokenizer": tokenizer} if "tokenizer" in params else dict(params)


def analyzer_of(described: dict[str, Any]) -> dict[str, Any] | None:
    """The analyzer_params of a described collection's text field (None when it shows none)."""
    for f in described.get("fields", []):
        if f.get("name") == "text":
            params = f.get("params", {}).get("analyzer_params")
            if params:
                return json.loads(params) if isinstance(params, str) else dict(params)
    return None


def dictionary_terms(terms: Iterable[str]) -> set[str]:
    """The terms fit for the analyzer's dictionary (non-blank, at most 64 characters)."""
    return {t.strip() for t in terms if t and t.strip() and len(t.strip()) <= 64}


def dictionary_of(described: dict[str, Any]) -> frozenset[str]:
    """The user dictionary of a described collection's text analyzer (empty without one)."""
    for f in described.get("fields", []):
        if f.get("name") == "text":
            params = f.get("params", {}).get("analyzer_params") or "{}"
            tokenizer = (json.loads(params) if isinstance(params, str) else params).get("tokenizer")
            if isinstance(tokenizer, dict):
                return frozenset(w for w in tokenizer.get("dict", ()) if w != "_default_")
    return frozenset()


def leaf_limit_violation(leaf: Chunk, search_text: str) -> str | None:
    """Why ``leaf`` cannot be written to the collection, or None when it fits."""
    meta = leaf.metadata
    skill_points = [str(s) for s in meta.get("skill_points") or []]
    values = {
        "kb_id": leaf.kb_id,
        "doc_id": leaf.doc_id,
        "heading_path": leaf.heading_path,
        "module": str(meta.get("module") or ""),
        "source": str(meta.get("source") or ""),
        "content": leaf.text,
        "text": search_text,
    }
    for name, value in values.items():
        size = len(value.encode("utf-8"))
        if size > LIMITS[name]:
            return f"{name} is {size} bytes, over the index limit of {LIMITS[name]}"
    if len(skill_points) > LIMITS["skill_points"]:
        return f"{len(skill_points)} skill points, over the index limit of {LIMITS['skill_points']}"
    for point in skill_points:
        if len(point.encode("utf-8")) > LIMITS["skill_point"]:
            return f"skill point {point[:40]!r}... is over the index limit of {LIMITS['skill_point']} bytes"
    return None
