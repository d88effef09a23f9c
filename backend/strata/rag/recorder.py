"""The per-query recorder that becomes the ``RetrievalMeta`` record.

One ``Recorder`` lives for one ``retrieve`` call: stages report timings,
counts and the errors they recovered from; ``result`` freezes it all.
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Iterator, Sequence

from strata.rag.deadline import REASON as DEADLINE_REASON
from strata.rag.deadline import Deadline, DeadlineExceeded
from strata.stores.parents import ParentFetch
from strata.strategy_table import DEFAULT_STRATEGY
from strata.types import (
    Filters,
    MergeRound,
    Mode,
    RerankOutcome,
    RetrievalMeta,
    RetrievalResult,
    RetrievedDocument,
    StageError,
)

logger = logging.getLogger("strata.rag")


class Recorder:
    """Mutable for the length of one query; everything it hands out is frozen."""

    def __init__(
        self, query: str, top_k: int, candidate_k: int, kb_ids: tuple[str, ...] | None, filters: Filters | None,
        *, deadline: Deadline | None = None,
    ) -> None:  # fmt: skip
        self.query, self.top_k, self.candidate_k = query, top_k, candidate_k
        self.deadline = deadline or Deadline(float("inf"))
        self.kb_ids, self.filters = kb_ids, filters
        self.mode: Mode = "hybrid"
        self.strategy = DEFAULT_STRATEGY
        self.variants: tuple[str, ...] = ()
        self.bm25_query: dict[str, Any] = {}  # what BM25 query hygiene left out, or why it did not run
        self.dense = self.sparse = self.fused = 0
        self.merge_rounds: list[MergeRound] = []
        self.rerank = RerankOutcome()
        self._started = time.perf_counter()
        self._timings: dict[str, float] = {}
        self._errors: list[StageError] = []
        self._degraded: list[str] = []
        self._parent_cache = {"hits": 0, "misses": 0, "leaf_hits": 0, "leaf_misses": 0}

    @property
    def filters_dict(self) -> dict[str, Any]:
        return self.filters.to_dict() if self.filters and not self.filters.is_empty() else {}

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._timings[stage] = self._timings.get(stage, 0.0) + (time.perf_counter() - started) * 1000

    def error(self, stage: str, exc: BaseException, *, degraded: str | None = None, note: str = "") -> None:
        """A stage failed; when the request's time is up, the reason ``deadline_exceeded`` is recorded too."""
        logger.warning("retrieval stage %s failed: %s: %s", stage, type(exc).__name__, exc)
        self.error_message(stage, type(exc).__name__, f"{exc} ({note})" if note else str(exc), degraded)
        if isinstance(exc, DeadlineExceeded) or self.deadline.expired():
            self.error_message(stage, "DeadlineExceeded", f"{stage} ran out of the request deadline", DEADLINE_REASON)

    def error_message(self, stage: str, error: str, message: str, degraded: str | None = None) -> None:
        self._errors.append(StageError(stage=stage, error=error, message=message[:500]))
        if degraded and degraded not in self._degraded:
            self._degraded.append(degraded)

    def failed(self, reason: str = "") -> list[Any]:
        """Marks the query failed (with ``reason`` when no stage error already says why)."""
        if reason:
            self.error_message("search", "NoRouteLeft", reason)
        self.mode = "failed"
        return []

    def route_counts(self, *, dense: int | None = None, sparse: int | None = None) -> None:
        self.dense = self.dense if dense is None else dense
        self.sparse = self.sparse if sparse is None else sparse

    def parent_fetch(self, fetch: ParentFetch) -> None:
        """A merge round read its parents (cache, then SQL); a parent not found is reported."""
        self._count(fetch, "")
        if fetch.missing:
            shown = ", ".join(fetch.missing[:5])
            self.error_message("parent_fetch", "MissingParent", f"{len(fetch.missing)} parent(s) not found: {shown}", "parent_missing")

    def leaf_fetch(self, fetch: ParentFetch) -> None:
        """The candidates' leaves were read (cache, then SQL); a leaf SQL no longer holds is reported."""
        self._count(fetch, "leaf_")
        if fetch.missing:
            self.error_message(
                "leaf_fetch", "MissingLeaf", f"{len(fetch.missing)} leaf(s) found by the search are not in SQL "
                f"(removed since, or orphans for `strata reconcile`), left out: {', '.join(fetch.missing[:5])}",
            )  # fmt: skip

    def _count(self, fetch: ParentFetch, prefix: str) -> None:
        """Counts a read through the parent store under ``{prefix}hits`` / ``{prefix}misses``."""
        self._parent_cache[f"{prefix}hits"] += fetch.cache_hits
        self._parent_cache[f"{prefix}misses"] += fetch.cache_misses
        if fetch.cache_error:
            self.error_message("parent_cache", "CacheError", fetch.cache_error, "parent_cache_unavailable")

    def result(self, docs: Sequence[RetrievedDocument], *, dropped: int) -> RetrievalResult:
        self._timings["total"] = (time.perf_counter() - self._started) * 1000
        status = "failed" if self.mode == "failed" else ("degraded" if self._degraded else "ok")
        meta = RetrievalMeta(
            query=self.query, top_k=self.top_k, candidate_k=self.candidate_k, status=status, mode=self.mode,
            kb_ids=self.kb_ids, filters=self.filters_dict, dense_candidates=self.dense,
            sparse_candidates=self.sparse, fused_candidates=self.fused, merge_rounds=tuple(self.merge_rounds),
            rerank=self.rerank, returned=len(docs), dropped_by_min_score=dropped,
            timings_ms={k: round(v, 3) for k, v in self._timings.items()}, cache="miss",
            parent_cache=dict(self._parent_cache), errors=tuple(self._errors), degraded=tuple(self._degraded),
            strategy=self.strategy, query_variants=self.variants, bm25_query=dict(self.bm25_query),
        )  # fmt: skip
        if status == "failed":
            logger.error("retrieval failed for %r: %s", self.query[:80], "; ".join(f"{e.stage}: {e.message}" for e in self._errors))
        return RetrievalResult(docs=tuple(docs), meta=meta)

    def uncached(self, result: RetrievalResult) -> RetrievalResult:
        return replace(result, meta=replace(result.meta, cache="off"))

    def with_cache_errors(self, result: RetrievalResult) -> RetrievalResult:
        """A computed result, plus what the query cache reported after it was computed."""
        meta = result.meta
        errors = tuple(e for e in self._errors if e not in meta.errors)
        degraded = tuple(d for d in self._degraded if d not in meta.degraded)
        if not errors and not degraded:
            return result
        status = meta.status if meta.status == "failed" else "degraded"
        return replace(result, meta=replace(meta, status=status, errors=meta.errors + errors, degraded=meta.degraded + degraded))

    def from_cache(self, result: RetrievalResult, source: str) -> RetrievalResult:
        """A result another call computed (``hit``: from the cache; ``shared``: a concurrent identical query)."""
        total = (time.perf_counter() - self._started) * 1000
        timings = dict(self._timings) | {"total": round(total, 3)}
        return self.with_cache_errors(replace(result, meta=replace(result.meta, cache=source, timings_ms=timings)))
