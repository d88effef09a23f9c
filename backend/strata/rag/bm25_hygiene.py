"""The BM25 query hygiene stage: leave out query terms that cost the BM25 route much and tell it little.

Milvus Lite's BM25 cost grows with the posting lists of the query's terms,
and a term found in most leaves (``的``, ``what``) or a punctuation token
(``？``, ``，``) adds little to the ranking. ``prune_bm25_query`` (pure) drops
punctuation and every term whose document frequency is over ``max_df`` of the
leaves, and keeps the rarest term when that would leave nothing. The dense
route always embeds the whole query.

Milvus analyzes the text it is given again, so the pruned text is the kept
terms joined by spaces, each once (a term that re-tokenizing a longer kept
term yields is not written again). A dropped term that comes back that way
(jieba's search mode cuts ``验证`` out of ``两步验证``) is searched after all,
and is not reported as dropped.

Term statistics change only when a kb's generation does (indexing bumps it),
and only the terms over ``max_df`` of the leaves matter (every other term is
kept), so ``FrequentTermsCache`` reads, once per set of kbs and generations,
their number of leaves and their frequent terms from the kbs' term sums: no
SQL per query. A failed lookup never fails a retrieval: BM25 searches the whole
query and the meta record's ``bm25_query`` says why. On a Milvus server the
query is not pruned (its analyzers are not the Python ones of Milvus Lite).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from strata.config import RetrievalSettings
from strata.errors import UnsupportedAnalyzer
from strata.rag.outcomes import BM25QueryOutcome
from strata.rag.run_state import RunState
from strata.resources import Resources
from strata.stores.analyzer import Tokenize, analyzer_tokenizer, is_punctuation
from strata.stores.term_stats import TermFrequencies
from strata.types import ServingState

# A server's analyzers (Rust) need not split or lowercase as the Python ones do: a pruned text could miss matches.
_SERVER = "a Milvus server analyzes BM25 text in its own code; the query is pruned only on Milvus Lite"

# (kb ids, max_df, timeout in seconds) -> the leaves and the frequent terms: ``DocumentStore.terms.frequent_terms``
Lookup = Callable[[Sequence[str], float, float | None], TermFrequencies]


class FrequentTermsCache:
    """Per set of kbs in their current generations: N and the terms over ``max_df`` of it; bounded, thread-safe.

    A query's other terms are rare by definition, so one read per generation answers every query.
    """

    def __init__(self, lookup: Lookup, max_df: float, *, max_kb_sets: int = 256) -> None:
        self._lookup, self._max_df = lookup, max_df
        self._entries: LRUCache[tuple[str, ...], tuple[tuple[str, ...], TermFrequencies]] = LRUCache(max_kb_sets)
        self._lock = threading.Lock()

    def get(self, generations: Mapping[str, Any], *, timeout_s: float | None = None) -> TermFrequencies:
        """The statistics of the kbs of ``generations`` (kb id -> its generation)."""
        kbs = tuple(sorted(generations))
        stamp = tuple(str(generations[k]) for k in kbs)
        with self._lock:
            entry = self._entries.get(kbs)
        if entry is not None and entry[0] == stamp:
            return entry[1]
        fetched = self._lookup(kbs, self._max_df, timeout_s)
        with self._lock:
            self._entries[kbs] = (stamp, fetched)
        return fetched


class BM25QueryHygiene:
    """Prunes a query's BM25 text by the term statistics of the kbs it searches (``STRATA_RETRIEVAL__BM25_MAX_DF``)."""

    def __init__(self, resources: Resources, settings: RetrievalSettings) -> None:
        self._max_df = settings.bm25_max_df
        self._min_leaves = settings.bm25_prune_min_leaves
        self._tokenize: Tokenize | None = None
        self._unsupported = "" if resources.settings.milvus.is_lite else _SERVER
        try:
            self._tokenize = None if self._unsupported else analyzer_tokenizer(resources.settings.milvus.analyzer)
        except UnsupportedAnalyzer as exc:
            self._unsupported = str(exc)
        self._stats = FrequentTermsCache(
            lambda kbs, max_df, timeout_s: resources.documents.terms.frequent_terms(kbs, max_df, timeout_s=timeout_s),
            self._max_df,
        )

    def apply(self, run: RunState, state: ServingState, text: str, routes: str) -> BM25QueryOutcome:
        """The BM25 text to search (``text`` pruned) and what was left out of it, or why nothing was."""
        log = run.log("bm25_query")
        if routes == "dense" or self._max_df >= 1.0:
            return log.outcome(BM25QueryOutcome, text=text)
        if self._tokenize is None:
            return log.outcome(BM25QueryOutcome, text=text, skipped=self._unsupported)
        try:
            with log.timed("bm25_query"):
                pruned, skipped = self._prune(run, state, text, self._tokenize)
        except Exception as exc:  # term statistics are an optimization: never a reason to fail a query
            log.error("bm25_query", exc, note="BM25 searched the whole query")
            unavailable = f"term statistics unavailable ({type(exc).__name__})"
            return log.outcome(BM25QueryOutcome, text=text, skipped=unavailable)
        return log.outcome(
            BM25QueryOutcome, text=pruned.text, dropped=pruned.dropped, max_df=self._max_df, skipped=skipped
        )

    def _prune(self, run: RunState, state: ServingState, text: str, tokenize: Tokenize) -> tuple[PrunedQuery, str]:
        """The pruned text, or the text as given and why it was not pruned."""
        stats = self._stats.get(state.generations, timeout_s=run.deadline.remaining())
        if stats.leaves < self._min_leaves:
            return PrunedQuery(text), f"{stats.leaves} leaves, fewer than bm25_prune_min_leaves ({self._min_leaves})"
        return prune_bm25_query(text, tokenize=tokenize, df=stats.df, leaves=stats.leaves, max_df=self._max_df), ""


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
