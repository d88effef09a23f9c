"""BM25 query hygiene: leave out query terms that cost the BM25 route much and tell it little (pure).

Milvus Lite's BM25 cost grows with the posting lists of the query's terms,
and a term found in most leaves (``的``, ``what``) or a punctuation token
(``？``, ``，``) adds little to the ranking. ``prune_bm25_query`` drops
punctuation and every term whose document frequency is over ``max_df`` of the
leaves, and keeps the rarest term when that would leave nothing. The dense
route always embeds the whole query.

Milvus analyzes the text it is given again, so the pruned text is the kept
terms joined by spaces, each once (a term that re-tokenizing a longer kept
term yields is not written again). A dropped term that comes back that way
(jieba's search mode cuts ``验证`` out of ``两步验证``) is searched after all,
and is not reported as dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strata.stores.analyzer import Tokenize, is_punctuation


@dataclass(frozen=True)
class PrunedQuery:
    """What BM25 searches and the query terms it no longer searches (none: ``text`` is the query as given)."""

    text: str
    dropped: tuple[str, ...] = ()


def query_terms(text: str, tokenize: Tokenize) -> list[str]:
    """The distinct tokens of ``text``, in query order."""
    return list(dict.fromkeys(tokenize(text)))


def prune_bm25_query(
    text: str, *, tokenize: Tokenize, df: Mapping[str, int], leaves: int, max_df: float
) -> PrunedQuery:
    """``text`` without punctuation tokens and terms in more than ``max_df`` of ``leaves`` (df missing = 0)."""
    terms = query_terms(text, tokenize)
    common = {t for t in terms if is_punctuation(t) or df.get(t, 0) > max_df * leaves}
    if not common:
        return PrunedQuery(text)
    kept = [t for t in terms if t not in common] or [_rarest(terms, df)]
    pruned = _joined(kept, tokenize)
    searched = set(tokenize(pruned))
    dropped = tuple(t for t in terms if t not in searched)
    return PrunedQuery(pruned, dropped) if dropped else PrunedQuery(text)


def _rarest(terms: list[str], df: Mapping[str, int]) -> str:
    """The term to keep when every term is common: a word before punctuation, then the lowest df, then the first."""
    return min(terms, key=lambda t: (is_punctuation(t), df.get(t, 0)))


def _joined(kept: list[str], tokenize: Tokenize) -> str:
    """The kept terms in query order, leaving out those a longer kept term re-tokenizes into."""
    covered: set[str] = set()
    written: set[str] = set()
    for term in sorted(kept, key=len, reverse=True):
        if term not in covered:
            written.add(term)
            covered.update(tokenize(term))
    return " ".join(t for t in kept if t in written)
