"""The stages after the search: merging and reranking, each returning its frozen outcome.

Each takes the run (for its deadline and a fresh ``StageLog``), the candidates and
what it calls (the chunk cache, the reranker), and returns an outcome holding
the candidates it produced and its part of the meta record (``MergeOutcome.rounds``,
``RerankStageOutcome.record``); ``Retriever`` hands them to ``RunState.add``.

=================  ===========================================  ============================================
stage              produces                                     on failure / fallback
=================  ===========================================  ============================================
``merge_parents``  two rounds L3→L2, L2→L1 (``merge_min_children``  parent read fails: leaves as found
                   children hit)                                (``parent_fetch_failed``); no time left:
                                                                leaves as found (``deadline_exceeded``)
``merge_adjacent`` consecutive leaves of a document joined      —
``rerank``         the service's scores, reordered              off / nothing to rerank: skipped; any
                                                                failure: fused order (``rerank_failed``)
=================  ===========================================  ============================================
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from strata.config import RetrievalSettings
from strata.errors import DeadlineExceeded
from strata.rag.adjacent import merge_adjacent_chunks
from strata.rag.candidates import Candidate
from strata.rag.merge import apply_merge, parents_to_fetch
from strata.rag.outcomes import MergeOutcome, RerankStageOutcome
from strata.rag.rerank import Reranker
from strata.rag.run_state import RunState, StageLog
from strata.stores.chunk_cache import ChunkRef
from strata.stores.chunk_reads import ChunkFetch
from strata.types import MergeRound, RerankOutcome


class ParentReads(Protocol):
    """What the merge reads parents with (``CachedChunks``: the chunk cache, then SQL)."""

    def get_many(self, refs: Sequence[ChunkRef], *, timeout_s: float | None = None) -> ChunkFetch: ...


def merge_parents(
    run: RunState, candidates: Sequence[Candidate], parents: ParentReads, settings: RetrievalSettings
) -> MergeOutcome:
    """Two auto-merge rounds (L3→L2, L2→L1); with no time left, the leaves as found are the answer."""
    log = run.log("merge")
    if run.deadline.expired():
        log.error("merge", DeadlineExceeded("merge"))
        return log.outcome(MergeOutcome, candidates=tuple(candidates))
    merged, rounds = list(candidates), []
    with log.timed("merge"):
        for round_no, level in ((1, 3), (2, 2)):
            merged, record = _merge_round(run, log, merged, parents, settings, round_no, level)
            rounds.append(record)
    return log.outcome(MergeOutcome, candidates=tuple(merged), rounds=tuple(rounds))


def _merge_round(
    run: RunState,
    log: StageLog,
    candidates: list[Candidate],
    parents: ParentReads,
    settings: RetrievalSettings,
    round_no: int,
    level: int,
) -> tuple[list[Candidate], MergeRound]:
    refs = parents_to_fetch(candidates, level=level, min_children=settings.merge_min_children)
    if not refs:
        return candidates, MergeRound(round=round_no)
    with log.timed("parent_fetch"):
        try:
            fetch = parents.get_many(refs, timeout_s=run.deadline.remaining())
        except Exception as exc:
            log.error("parent_fetch", exc, degraded="parent_fetch_failed")
            return candidates, MergeRound(round=round_no, parents_missing=len(refs))
    log.parent_fetch(fetch)
    return apply_merge(
        candidates,
        fetch.chunks,
        round_no=round_no,
        level=level,
        min_children=settings.merge_min_children,
        min_ratio=settings.merge_min_ratio,
        score_mode=settings.merge_score,
        max_parent_chars=settings.merge_max_chars,
    )


def merge_adjacent(run: RunState, candidates: Sequence[Candidate]) -> MergeOutcome:
    """The ``adjacent`` strategy's merge: consecutive leaves of a document joined (no rounds)."""
    log = run.log("merge")
    with log.timed("merge"):
        merged = merge_adjacent_chunks(list(candidates))
    return log.outcome(MergeOutcome, candidates=tuple(merged))


def rerank(run: RunState, candidates: Sequence[Candidate], reranker: Reranker) -> RerankStageOutcome:
    """The reranker's order, or the fused order when it fails (or the deadline leaves it no time)."""
    log = run.log("rerank")
    started = time.perf_counter()
    try:
        with log.timed("rerank"):
            if run.deadline.expired():
                raise DeadlineExceeded("rerank")
            texts = [c.chunk.text for c in candidates]
            scores = reranker.rerank(run.inputs.query, texts, timeout_s=run.deadline.remaining())
    except Exception as exc:
        latency = round((time.perf_counter() - started) * 1000, 2)
        log.error("rerank", exc, degraded="rerank_failed")
        failed = RerankOutcome("failed", f"{type(exc).__name__}: {exc}", reranker.provider, latency)
        return log.outcome(RerankStageOutcome, candidates=tuple(candidates), record=failed)
    latency = round((time.perf_counter() - started) * 1000, 2)
    reranked = tuple(_reranked(candidates[s.index], s.score) for s in scores)
    applied = RerankOutcome("applied", "ok", reranker.provider, latency)
    return log.outcome(RerankStageOutcome, candidates=reranked, record=applied)


def rerank_skipped(run: RunState, candidates: Sequence[Candidate], reason: str) -> RerankStageOutcome:
    """The fused order, rerank not run (``reason``: not configured, off for this request, no candidates)."""
    return run.log("rerank").outcome(
        RerankStageOutcome, candidates=tuple(candidates), record=RerankOutcome("skipped", reason)
    )


def _reranked(cand: Candidate, score: float) -> Candidate:
    return replace(cand, score=score, trace=replace(cand.trace, rerank_score=score, score_stage="rerank"))
