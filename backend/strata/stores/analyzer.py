"""The BM25 analyzer's tokens, computed in this process (pure).

Milvus Lite 3.2.2 analyzes the BM25 text field in Python, and this module does
the same for the analyzer params strata configures (``STRATA_MILVUS__ANALYZER``):

- ``jieba`` (the default): ``jieba.cut_for_search`` (mode ``search``, also when
  the tokenizer is the plain string) or ``jieba.cut`` (any other mode); each
  token ``strip().lower()``, empty ones dropped;
- ``standard``: ``\\w+`` over the lowercased text;
- then the stop words of every ``{"type": "stop"}`` filter.

So term statistics counted while indexing and the tokens of a query are the
tokens Milvus Lite indexes and searches. jieba's dictionary is process-wide:
the user dictionary Milvus Lite loads when it opens the collection applies here
too. A Milvus server analyzes in its own code; there the tokens are close to
these, not guaranteed equal. Any other tokenizer is ``UnsupportedAnalyzer``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from strata.errors import UnsupportedAnalyzer

Tokenize = Callable[[str], list[str]]

_WORD = re.compile(r"\w+", re.UNICODE)


def analyzer_tokenizer(params: Mapping[str, Any] | None) -> Tokenize:
    """The tokenizer Milvus Lite builds from ``params`` (its ``create_analyzer``), as a function of text."""
    if params is None:
        return partial(_standard, stop_words=frozenset())
    tokenizer = params.get("tokenizer") or params.get("type", "standard")
    stop_words = _stop_words(params)
    if isinstance(tokenizer, str):
        name, mode = tokenizer, None
    elif isinstance(tokenizer, Mapping):
        name, mode = tokenizer.get("type", "standard"), tokenizer.get("mode")
    else:
        raise UnsupportedAnalyzer(f"analyzer tokenizer {tokenizer!r} is neither a name nor a mapping")
    if name == "standard":
        return partial(_standard, stop_words=stop_words)
    if name == "jieba":
        return partial(jieba_tokens, search=(mode or "search") == "search", stop_words=stop_words)
    raise UnsupportedAnalyzer(f"analyzer tokenizer {name!r} is not reproduced in Python (only jieba and standard are)")


LITE_TOKENIZERS = ("standard", "jieba")
_LITE_FILTERS = ("lowercase", "stop")  # Lite lowercases every token itself and applies explicit stop-word lists


def lite_analyzer_problem(params: Mapping[str, Any]) -> str | None:
    """Why Milvus Lite would not analyze as ``params`` say, or None when it would.

    Lite builds the ``standard`` and ``jieba`` tokenizers only: any other tokenizer or built-in
    analyzer (``{"type": "english"}``) fails at the first insert, and a filter other than
    ``lowercase`` or an explicit ``stop`` list (a stemmer, ``"_english_"``) is ignored without a word.
    """
    tokenizer = params.get("tokenizer") or params.get("type", "standard")
    name = tokenizer.get("type", "standard") if isinstance(tokenizer, Mapping) else tokenizer
    unsupported = [] if name in LITE_TOKENIZERS else [f"tokenizer {name!r}"]
    filters = params.get("filter") or []
    unsupported += [
        f"filter {f!r}" for f in (filters if isinstance(filters, list) else [filters]) if not _lite_filter(f)
    ]
    if not unsupported:
        return None
    return (
        f"Milvus Lite supports only the {' and '.join(LITE_TOKENIZERS)} tokenizers with lowercase and stop "
        f"(explicit word list) filters, not {', '.join(unsupported)}: use e.g. "
        '{"tokenizer": "standard", "filter": ["lowercase", {"type": "stop", "stop_words": ["the", "a"]}]}, '
        "or a Milvus server (STRATA_MILVUS__URI=http://host:19530)"
    )


def _lite_filter(spec: Any) -> bool:
    name = spec.get("type") if isinstance(spec, Mapping) else spec
    if name not in _LITE_FILTERS:
        return False
    words = spec.get("stop_words", []) if isinstance(spec, Mapping) else []
    return isinstance(words, list) and not any(_builtin_list(str(w)) for w in words)


def _builtin_list(word: str) -> bool:
    """A built-in stop-word list's name (``_english_``), which Lite does not know; ``_`` itself is a word."""
    return len(word) > 2 and word.startswith("_") and word.endswith("_")


def is_punctuation(term: str) -> bool:
    """True for a token of punctuation, symbols, separators or control characters only."""
    return all(unicodedata.category(ch)[0] in "PSZC" for ch in term)


def _standard(text: str, *, stop_words: frozenset[str]) -> list[str]:
    return [t for t in _WORD.findall(text.lower()) if t not in stop_words]


def jieba_tokens(text: str, *, search: bool, stop_words: frozenset[str]) -> list[str]:
    import jieba  # imported on first use: its dictionary loads on the first cut, never at import time

    raw = jieba.cut_for_search(text) if search else jieba.cut(text)
    tokens = [t.strip().lower() for t in raw if t.strip()]
    return [t for t in tokens if t not in stop_words]


def _stop_words(params: Mapping[str, Any]) -> frozenset[str]:
    filters = params.get("filter")
    if not isinstance(filters, list):
        return frozenset()
    words: set[str] = set()
    for spec in filters:
        if isinstance(spec, dict) and spec.get("type") == "stop" and isinstance(spec.get("stop_words"), (list, set)):
            words.update(str(w) for w in spec["stop_words"])
    return frozenset(words)
