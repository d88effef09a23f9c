"""The BM25 query hygiene stage: term statistics per kb generation, and the pruned BM25 text.

Term statistics change only when a kb's generation does (indexing bumps it),
so ``TermFrequencyCache`` remembers, per set of kbs, their number of leaves and
the df of every term asked in their current generations: SQL is asked once per
query that brings terms not seen in this generation, and not at all in the
steady state. A failed lookup never fails a retrieval: BM25 searches the whole
query and the meta record's ``bm25_query`` says why. On a Milvus server the
query is not pruned (its analyzers are not the Python ones of Milvus Lite).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from backend.config import RetrievalSettings
from backend.rag.bm25_query import PrunedQuery, prune_bm25_query, query_terms
from backend.rag.expansion import Expansion
from backend.rag.recorder import Recorder
from backend.resources import Resources
from backend.stores.analyzer import Tokenize, UnsupportedAnalyzer, analyzer_tokenizer
from backend.stores.term_stats import TermFrequencies
from backend.types import ServingState

# A server's analyzers (Rust) need not split or lowercase as the Python ones do: a pruned text could miss matches.
_SERVER = "a Milvus server analyzes BM25 text in its own code; the query is pruned only on Milvus Lite"

# (kb ids, terms, timeout in seconds) -> the statistics: ``DocumentStore.term_frequencies``
Lookup = Callable[[Sequence[str], Sequence[str], float | None], TermFrequencies]


@dataclass
class _Generation:
    stamp: tuple[str, ...]
    leaves: int
    df: dict[str, int] = field(default_factory=dict)


class TermFrequencyCache:
    """N and df per term of each set of kbs in its current generations; bounded, thread-safe."""

    def __init__(self, lookup: Lookup, *, max_kb_sets: int = 256, max_terms: int = 50_000) -> None:
        self._lookup = lookup
        self._max_kb_sets, self._max_terms = max_kb_sets, max_terms
        self._entries: OrderedDict[tuple[str, ...], _Generation] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, generations: Mapping[str, Any], terms: Sequence[str], *, timeout_s: float | None = None) -> TermFrequencies:
        """The statistics of ``terms`` over the kbs of ``generations`` (kb id -> its generation)."""
        kbs = tuple(sorted(generations))
        stamp = tuple(str(generations[k]) for k in kbs)
        wanted = list(dict.fromkeys(terms))
        with self._lock:
            entry = self._entries.get(kbs)
            if entry is not None and entry.stamp != stamp:
                entry = None  # a kb changed since: its statistics are asked anew
            missing = [t for t in wanted if entry is None or t not in entry.df]
            if entry is not None and not missing:
                self._entries.move_to_end(kbs)
                return TermFrequencies(entry.leaves, {t: entry.df[t] for t in wanted})
        fetched = self._lookup(kbs, missing, timeout_s)
        with self._lock:
            return self._remember(kbs, stamp, fetched, wanted)

    def _remember(
        self, kbs: tuple[str, ...], stamp: tuple[str, ...], fetched: TermFrequencies, wanted: list[str]
    ) -> TermFrequencies:
        entry = self._entries.get(kbs)
        if entry is None or entry.stamp != stamp:
            entry = self._entries[kbs] = _Generation(stamp, fetched.leaves)
        entry.df.update(fetched.df)
        while len(entry.df) > self._max_terms:
            entry.df.pop(next(iter(entry.df)))
        self._entries.move_to_end(kbs)
        while len(self._entries) > self._max_kb_sets:
            self._entries.popitem(last=False)
        return TermFrequencies(entry.leaves, {t: fetched.df.get(t, entry.df.get(t, 0)) for t in wanted})


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
        self._stats = TermFrequencyCache(
            lambda kbs, terms, timeout_s: resources.documents.term_frequencies(kbs, terms, timeout_s=timeout_s)
        )

    def apply(self, run: Recorder, state: ServingState, expansion: Expansion, routes: str) -> Expansion:
        """``expansion`` with its BM25 text pruned; ``run.bm25_query`` records what was left out, or why nothing was."""
        if routes == "dense" or self._max_df >= 1.0:
            return expansion
        if self._tokenize is None:
            run.bm25_query = {"skipped": self._unsupported}
            return expansion
        with run.timed("bm25_query"):
            try:
                pruned = self._prune(run, state, expansion.bm25_text, self._tokenize)
            except Exception as exc:  # term statistics are an optimization: never a reason to fail a query
                run.error("bm25_query", exc, note="BM25 searched the whole query")
                run.bm25_query = {"skipped": f"term statistics unavailable ({type(exc).__name__})"}
                return expansion
        return replace(expansion, bm25_text=pruned.text) if pruned.dropped else expansion

    def _prune(self, run: Recorder, state: ServingState, text: str, tokenize: Tokenize) -> PrunedQuery:
        stats = self._stats.get(state.generations, query_terms(text, tokenize), timeout_s=run.deadline.remaining())
        if stats.leaves < self._min_leaves:
            run.bm25_query = {"skipped": f"{stats.leaves} leaves, fewer than bm25_prune_min_leaves ({self._min_leaves})"}
            return PrunedQuery(text)
        pruned = prune_bm25_query(text, tokenize=tokenize, df=stats.df, leaves=stats.leaves, max_df=self._max_df)
        if pruned.dropped:
            run.bm25_query = {"dropped": list(pruned.dropped), "text": pruned.text, "max_df": self._max_df}
        return pruned
