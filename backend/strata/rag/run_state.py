"""One query's run: its inputs and what each stage returned, folded into the ``RetrievalMeta`` record once.

Stages return frozen outcomes (``strata.rag.outcomes``: what the stage produced,
the mode a search ran in, its errors, reason codes and timings); the ``RunState``
of the ``retrieve`` call collects them in the order they ended. Nothing a stage
reports is overwritten by a later one, and no stage sets a field of the run:
``result`` is the one place that combines the inputs and the outcomes into the
record and computes its ``mode`` and ``status`` (``run_mode``, ``run_status``),
for a computed result and for one reused from the query cache alike.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from strata import tracing
from strata.errors import DeadlineExceeded
from strata.logs import QUERY
from strata.rag.deadline import Deadline
from strata.rag.expansion import Expansion
from strata.rag.outcomes import (
    BM25QueryOutcome,
    CacheOutcome,
    FinalizeOutcome,
    FusionOutcome,
    MergeOutcome,
    RerankStageOutcome,
    SearchOutcome,
    StageOutcome,
)
from strata.stores.chunk_reads import ChunkFetch
from strata.strategy_table import DEFAULT_STRATEGY
from strata.types import (
    CacheState,
    Filters,
    Mode,
    RerankOutcome,
    RetrievalMeta,
    RetrievalResult,
    StageError,
    Status,
)

logger = logging.getLogger("strata.rag")

UNKNOWN_KB = "unknown_kb"  # the reason code of a kb the serving state does not know
VARIANT_FAILED = "query_variant_failed"
"""The reason code of a ``fusion`` query some of whose variants failed while others found evidence."""

# The search modes, most capable first: a run whose searches ran in several reports the least capable.
_MODES: tuple[Mode, ...] = ("hybrid", "dense", "sparse", "dense_fallback", "sparse_fallback")


OutcomeT = TypeVar("OutcomeT", bound=StageOutcome)


class StageLog:
    """A stage's own log while it runs; ``outcome`` freezes it. Never shared between stages."""

    def __init__(self, stage: str, deadline: Deadline) -> None:
        self.stage, self.deadline = stage, deadline
        self._errors: list[StageError] = []
        self._degraded: list[str] = []
        self._timings: dict[str, float] = {}
        self._parent_cache: dict[str, int] = {}

    @contextmanager
    def timed(self, key: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._timings[key] = self._timings.get(key, 0.0) + (time.perf_counter() - started) * 1000

    def error(self, stage: str, exc: BaseException, *, degraded: str | None = None, note: str = "") -> None:
        """A step failed; when the request's time is up, the reason ``deadline_exceeded`` is recorded too."""
        logger.warning("retrieval stage %s failed: %s: %s", stage, type(exc).__name__, exc)
        self.error_message(stage, type(exc).__name__, f"{exc} ({note})" if note else str(exc), degraded)
        if isinstance(exc, DeadlineExceeded) or self.deadline.expired():
            self.error_message(
                stage, "DeadlineExceeded", f"{stage} ran out of the request deadline", DeadlineExceeded.reason
            )

    def error_message(self, stage: str, error: str, message: str, degraded: str | None = None) -> None:
        self._errors.append(StageError(stage=stage, error=error, message=message[:500]))
        if degraded and degraded not in self._degraded:
            self._degraded.append(degraded)

    def parent_fetch(self, fetch: ChunkFetch) -> None:
        """A merge round read its parents (cache, then SQL); a parent not found is reported."""
        self._count(fetch, "")
        if fetch.missing:
            shown = ", ".join(fetch.missing[:5])
            self.error_message(
                "parent_fetch", "MissingParent", f"{len(fetch.missing)} parent(s) not found: {shown}", "parent_missing"
            )

    def leaf_fetch(self, fetch: ChunkFetch) -> None:
        """The candidates' leaves were read (cache, then SQL); a leaf SQL no longer holds is reported."""
        self._count(fetch, "leaf_")
        if fetch.missing:
            self.error_message(
                "leaf_fetch",
                "MissingLeaf",
                f"{len(fetch.missing)} leaf(s) found by the search are not in SQL "
                f"(removed since, or orphans for `strata reconcile`), left out: {', '.join(fetch.missing[:5])}",
                "unserved_leaves",
            )

    def _count(self, fetch: ChunkFetch, prefix: str) -> None:
        """Counts a read through the chunk cache under ``{prefix}hits`` / ``{prefix}misses``."""
        for key, n in ((f"{prefix}hits", fetch.cache_hits), (f"{prefix}misses", fetch.cache_misses)):
            self._parent_cache[key] = self._parent_cache.get(key, 0) + n
        if fetch.cache_error:
            self.error_message("parent_cache", "CacheError", fetch.cache_error, "parent_cache_unavailable")

    def outcome(self, kind: type[OutcomeT] = StageOutcome, **produced: Any) -> OutcomeT:  # type: ignore[assignment]
        """The frozen outcome: what was logged, and what the stage ``produced`` (the fields of ``kind``)."""
        return kind(
            stage=self.stage,
            errors=tuple(self._errors),
            degraded=tuple(self._degraded),
            timings_ms=tuple(self._timings.items()),
            parent_cache=tuple(self._parent_cache.items()),
            **produced,
        )


@dataclass(frozen=True)
class RunInputs:
    """What one ``retrieve`` call was asked, decided before any stage runs (the strategy's name, its query
    variants and the synonyms expansion added included)."""

    query: str
    top_k: int
    candidate_k: int
    kb_ids: tuple[str, ...] | None = None
    filters: Filters | None = None
    strategy: str = DEFAULT_STRATEGY
    variants: tuple[str, ...] = ()
    expansion: Expansion | None = None

    @property
    def filters_dict(self) -> dict[str, Any]:
        return self.filters.to_dict() if self.filters and not self.filters.is_empty() else {}

    @property
    def bm25_text(self) -> str:
        """The BM25 route's text before pruning: the query plus the terms expansion added."""
        return self.expansion.bm25_text if self.expansion is not None else self.query

    def expansion_record(self) -> dict[str, Any]:
        """The meta record's ``expansion``: the terms synonyms added to the BM25 query (none: empty)."""
        if self.expansion is None or not self.expansion.added_terms:
            return {}
        return {"added_terms": list(self.expansion.added_terms), "bm25_query": self.expansion.bm25_text}


class RunState:
    """One ``retrieve`` call: its inputs, and the outcomes of the stages that ran, in the order they ended.

    Stages read the inputs and hand their outcomes to ``add`` (or, for a single step, report it
    with ``timed`` / ``error``, each an outcome of its own); ``result`` folds them into the record.
    """

    def __init__(self, inputs: RunInputs, *, deadline: Deadline | None = None) -> None:
        self.inputs = inputs
        self.deadline = deadline or Deadline(float("inf"))
        self._started = time.perf_counter()
        self._started_ns = time.time_ns()
        self._outcomes: list[StageOutcome] = []
        self._ended_ns: list[int] = []  # when each outcome was added (its stage's end), for its span

    @property
    def outcomes(self) -> tuple[StageOutcome, ...]:
        return tuple(self._outcomes)

    def log(self, stage: str) -> StageLog:
        """A fresh log for one stage of this run (under its deadline)."""
        return StageLog(stage, self.deadline)

    def add(self, outcome: OutcomeT) -> OutcomeT:
        """Collects a stage's outcome; returns it."""
        self._outcomes.append(outcome)
        self._ended_ns.append(time.time_ns())
        return outcome

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        log = self.log(stage)
        try:
            with log.timed(stage):
                yield
        finally:
            self.add(log.outcome())

    def error(self, stage: str, exc: BaseException, *, degraded: str | None = None, note: str = "") -> None:
        log = self.log(stage)
        log.error(stage, exc, degraded=degraded, note=note)
        self.add(log.outcome())

    def error_message(self, stage: str, error: str, message: str, degraded: str | None = None) -> None:
        log = self.log(stage)
        log.error_message(stage, error, message, degraded)
        self.add(log.outcome())

    def result(self) -> RetrievalResult:
        """The record of the run so far: the inputs and every outcome, combined here and nowhere else.

        A result the query cache reused (``CacheOutcome.reused``) keeps its record, with this run's cache
        state and timings, and this run's own errors and reason codes added (its serving state's, the
        cache's); its status is worked out from its mode and the reasons as a computed one's is.
        """
        outcomes = self.outcomes
        cache = _last(outcomes, CacheOutcome)
        if cache is not None and cache.reused is not None:
            return self._reused(cache.reused, cache.source)
        inputs = self.inputs
        searches = [o for o in outcomes if isinstance(o, SearchOutcome)]
        fusion, final = _last(outcomes, FusionOutcome), _last(outcomes, FinalizeOutcome) or FinalizeOutcome("finalize")
        rerank, bm25 = _last(outcomes, RerankStageOutcome), _last(outcomes, BM25QueryOutcome)
        meta = RetrievalMeta(
            query=inputs.query,
            top_k=inputs.top_k,
            candidate_k=inputs.candidate_k,
            status=run_status(outcomes),
            mode=run_mode(outcomes),
            kb_ids=inputs.kb_ids,
            filters=inputs.filters_dict,
            dense_candidates=sum(o.dense for o in searches),
            sparse_candidates=sum(o.sparse for o in searches),
            fused_candidates=fusion.fused if fusion else sum(o.fused for o in searches),
            merge_rounds=tuple(r for o in outcomes if isinstance(o, MergeOutcome) for r in o.rounds),
            rerank=rerank.record if rerank else RerankOutcome(),
            returned=len(final.docs),
            dropped_by_min_score=final.dropped,
            timings_ms=self._timings(),
            cache=cache.source if cache else "miss",
            parent_cache=_parent_cache(outcomes),
            errors=_errors(outcomes),
            degraded=_degraded(outcomes),
            strategy=inputs.strategy,
            query_variants=inputs.variants,
            expansion=inputs.expansion_record(),
            bm25_query=bm25.record() if bm25 else {},
        )
        return RetrievalResult(docs=final.docs, meta=meta)

    def _reused(self, reused: RetrievalResult, source: CacheState) -> RetrievalResult:
        stored, outcomes = reused.meta, self.outcomes
        errors = stored.errors + tuple(e for e in _errors(outcomes) if e not in stored.errors)
        degraded = stored.degraded + tuple(d for d in _degraded(outcomes) if d not in stored.degraded)
        meta = replace(
            stored,
            status=_status(stored.mode, degraded),
            cache=source,
            timings_ms=self._timings(),
            errors=errors,
            degraded=degraded,
        )
        return replace(reused, meta=meta)

    def finish(self) -> RetrievalResult:
        """The run's ``result``, once a failure of its own is logged and its spans are written
        (``strata.tracing``; nothing when tracing is off). Called once, when the run ends."""
        result = self.result()
        meta = result.meta
        if meta.status == "failed" and meta.cache not in ("hit", "shared"):
            # an unknown kb is the caller's mistake, not a failure of the service; the query text is the user's
            # (logged only when STRATA_LOG__QUERY_TEXT asks for it: strata.logs)
            level = logging.INFO if meta.degraded == (UNKNOWN_KB,) else logging.ERROR
            reasons = "; ".join(f"{e.stage}: {e.message}" for e in meta.errors)
            logger.log(level, "retrieval failed: %s", reasons, extra={QUERY: self.inputs.query})
        if tracing.active():
            tracing.record_retrieval(meta, self._started_ns, time.time_ns(), self._stage_timings())
        return result

    def _stage_timings(self) -> list[tracing.StageTiming]:
        """Each outcome as a span: ending when it was added, lasting what its stage measured."""
        return [
            tracing.StageTiming(o.stage, ended - int(_duration_ms(o) * 1e6), ended, _stage_attributes(o))
            for o, ended in zip(self._outcomes, self._ended_ns)
        ]

    def _timings(self) -> dict[str, float]:
        """Each timing key summed over the outcomes, and the run's ``total`` so far."""
        summed: dict[str, list[float]] = {}
        for outcome in self._outcomes:
            for key, ms in outcome.timings_ms:
                summed.setdefault(key, []).append(ms)
        timings = {key: round(math.fsum(ms), 3) for key, ms in summed.items()}
        timings["total"] = round((time.perf_counter() - self._started) * 1000, 3)
        return timings


def _last(outcomes: Sequence[StageOutcome], kind: type[OutcomeT]) -> OutcomeT | None:
    """The last outcome of a kind (a run has at most one of each of these)."""
    return next((o for o in reversed(outcomes) if isinstance(o, kind)), None)


def _duration_ms(outcome: StageOutcome) -> float:
    """The time the stage measured: its own timing, else its longest step's (none: it only reported)."""
    timings = dict(outcome.timings_ms)
    return timings.get(outcome.stage, max(timings.values(), default=0.0))


def _stage_attributes(outcome: StageOutcome) -> dict[str, Any]:
    """A stage span's attributes: its errors, reason codes and counts (never a query's text)."""
    attributes: dict[str, Any] = {
        "strata.stage.errors": [e.error for e in outcome.errors],
        "strata.stage.degraded": list(outcome.degraded),
        **{f"strata.stage.timings_ms.{key}": round(ms, 3) for key, ms in outcome.timings_ms},
        **{f"strata.stage.parent_cache.{key}": n for key, n in outcome.parent_cache},
    }
    if isinstance(outcome, SearchOutcome):
        attributes.update(
            {
                "strata.stage.mode": outcome.mode,
                "strata.stage.candidates": len(outcome.candidates),
                "strata.stage.dense": outcome.dense,
                "strata.stage.sparse": outcome.sparse,
                "strata.stage.fused": outcome.fused,
            }
        )
    elif isinstance(outcome, FusionOutcome):
        attributes.update({"strata.stage.candidates": len(outcome.candidates), "strata.stage.fused": outcome.fused})
    return attributes


def run_mode(outcomes: Sequence[StageOutcome]) -> Mode:
    """The run's mode: the least capable mode among the searches that answered; ``failed`` when
    none did (or none ran: the run stopped before searching)."""
    answered = [o.mode for o in outcomes if isinstance(o, SearchOutcome) and o.mode != "failed"]
    return max(answered, key=_MODES.index) if answered else "failed"


def run_status(outcomes: Sequence[StageOutcome]) -> Status:
    """``failed`` when no search answered; else ``degraded`` when any outcome gave a reason code (or
    a ``fusion`` variant failed while others answered); else ``ok``."""
    return _status(run_mode(outcomes), _degraded(outcomes))


def _status(mode: Mode, degraded: Sequence[str]) -> Status:
    """``failed`` when no search answered, else ``degraded`` when there is a reason code, else ``ok``."""
    if mode == "failed":
        return "failed"
    return "degraded" if degraded else "ok"


def _degraded(outcomes: Sequence[StageOutcome]) -> tuple[str, ...]:
    reasons = [reason for o in outcomes for reason in o.degraded]
    searches = [o for o in outcomes if isinstance(o, SearchOutcome)]
    if any(o.mode == "failed" for o in searches) and any(o.mode != "failed" for o in searches):
        reasons.append(VARIANT_FAILED)
    return tuple(dict.fromkeys(reasons))


def _errors(outcomes: Sequence[StageOutcome]) -> tuple[StageError, ...]:
    errors = [e for o in outcomes for e in o.errors]
    searches = [o for o in outcomes if isinstance(o, SearchOutcome)]
    if VARIANT_FAILED in _degraded(outcomes):
        failed = [o.variant for o in searches if o.mode == "failed"]
        errors.append(
            StageError(
                stage="search",
                error="QueryVariantFailed",
                message=f"{len(failed)} of {len(searches)} query variants failed (no route answered), fused without them: "
                + "; ".join(repr(v[:80]) for v in failed),
            )
        )
    return tuple(errors)


def _parent_cache(outcomes: Sequence[StageOutcome]) -> dict[str, int]:
    counts = {"hits": 0, "misses": 0, "leaf_hits": 0, "leaf_misses": 0}
    for outcome in outcomes:
        for key, n in outcome.parent_cache:
            counts[key] = counts.get(key, 0) + n
    return counts
