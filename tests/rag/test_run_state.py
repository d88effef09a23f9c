"""``RunState``: stages hand it frozen outcomes, and ``result`` alone combines them (and the inputs) into the record.

Pure: the outcomes are built by hand, as the stages would return them; nothing here touches a store.
"""

from __future__ import annotations

import dataclasses

import pytest

from strata.rag.expansion import Expansion
from strata.rag.outcomes import (
    BM25QueryOutcome,
    CacheOutcome,
    FinalizeOutcome,
    MergeOutcome,
    RerankStageOutcome,
    SearchOutcome,
    StageOutcome,
)
from strata.rag.run_state import RunInputs, RunState
from strata.types import MergeRound, RerankOutcome, RetrievalMeta, RetrievalResult, RetrievedDocument, StageError

pytestmark = pytest.mark.unit

DOC = RetrievedDocument(content="Water tomatoes twice a week.", score=0.9, metadata={"chunk_id": "c1"})
CACHE_DOWN = StageError(stage="query_cache", error="CacheError", message="Redis refused the connection")


def inputs(**changes: object) -> RunInputs:
    return dataclasses.replace(RunInputs("how often to water tomatoes", 3, 9, ("garden",)), **changes)


def answered(run: RunState) -> RunState:
    """``run`` after a hybrid search that answered and a finalize that kept ``DOC``."""
    run.add(SearchOutcome("search", mode="hybrid", dense=9, sparse=4, fused=9))
    run.add(FinalizeOutcome("finalize", docs=(DOC,), dropped=1))
    return run


def test_the_record_is_the_inputs_and_what_each_stage_returned() -> None:
    run = RunState(
        inputs(
            strategy="fusion",
            variants=("how often to water tomatoes", "watering"),
            expansion=Expansion("how often to water tomatoes irrigation", ("irrigation",)),
        )
    )
    run.add(BM25QueryOutcome("bm25_query", text="water tomatoes", dropped=("how", "often", "to"), max_df=0.4))
    run.add(SearchOutcome("search", mode="hybrid", dense=9, sparse=4, fused=9))
    run.add(MergeOutcome("merge", rounds=(MergeRound(1, parents_merged=1, children_replaced=3), MergeRound(2))))
    run.add(RerankStageOutcome("rerank", record=RerankOutcome("applied", "ok", "jina", 12.5)))
    run.add(FinalizeOutcome("finalize", docs=(DOC,), dropped=1))
    result = run.result()
    meta = result.meta
    assert result.docs == (DOC,) and (meta.returned, meta.dropped_by_min_score) == (1, 1)
    assert (meta.status, meta.mode, meta.cache) == ("ok", "hybrid", "miss")
    assert meta.merge_rounds == (MergeRound(1, parents_merged=1, children_replaced=3), MergeRound(2))
    assert meta.rerank == RerankOutcome("applied", "ok", "jina", 12.5)
    assert meta.bm25_query == {"dropped": ["how", "often", "to"], "text": "water tomatoes", "max_df": 0.4}
    assert (meta.strategy, meta.query_variants) == ("fusion", ("how often to water tomatoes", "watering"))
    assert meta.expansion == {"added_terms": ["irrigation"], "bm25_query": "how often to water tomatoes irrigation"}
    assert (meta.dense_candidates, meta.sparse_candidates, meta.fused_candidates) == (9, 4, 9)


def test_a_run_no_stage_reported_on_is_failed_with_the_records_defaults() -> None:
    meta = RunState(inputs()).result().meta
    assert (meta.status, meta.mode, meta.returned, meta.merge_rounds, meta.bm25_query) == (
        "failed",
        "failed",
        0,
        (),
        {},
    )
    assert meta.rerank == RerankOutcome() and meta.expansion == {}


def test_a_failed_rerank_degrades_the_run_and_says_why() -> None:
    run = answered(RunState(inputs()))
    failed = RerankOutcome("failed", "RerankError: 500", "jina", 3.0)
    rerank_error = StageError(stage="rerank", error="RerankError", message="500")
    run.add(RerankStageOutcome("rerank", errors=(rerank_error,), degraded=("rerank_failed",), record=failed))
    meta = run.result().meta
    assert (meta.status, meta.rerank, meta.degraded, meta.errors) == (
        "degraded",
        failed,
        ("rerank_failed",),
        (rerank_error,),
    )


def test_a_cache_error_after_a_computed_result_degrades_it_but_never_lifts_a_failure() -> None:
    cache_down = CacheOutcome("query_cache", errors=(CACHE_DOWN,), degraded=("query_cache_unavailable",), source="miss")
    ok = answered(RunState(inputs()))
    assert ok.result().meta.status == "ok"  # what the cache stores, before the lookup reported
    ok.add(cache_down)
    meta = ok.result().meta
    assert (meta.status, meta.cache, meta.errors, meta.degraded) == (
        "degraded",
        "miss",
        (CACHE_DOWN,),
        ("query_cache_unavailable",),
    )
    failed = RunState(inputs())
    failed.add(cache_down)
    assert (failed.result().meta.status, failed.result().meta.mode) == ("failed", "failed")


def stored(status: str = "ok", mode: str = "hybrid", degraded: tuple[str, ...] = ()) -> RetrievalResult:
    meta = RetrievalMeta(
        query="how often to water tomatoes",
        top_k=3,
        candidate_k=9,
        status=status,
        mode=mode,  # type: ignore[arg-type]
        kb_ids=("garden",),
        returned=1,
        cache="miss",
        degraded=degraded,
        timings_ms={"search": 40.0, "total": 90.0},
    )
    return RetrievalResult(docs=(DOC,), meta=meta)


def test_a_reused_result_keeps_its_record_with_this_runs_cache_state_timings_and_errors() -> None:
    run = RunState(inputs())
    with run.timed("state"):
        pass
    run.add(
        CacheOutcome(
            "query_cache", errors=(CACHE_DOWN,), degraded=("query_cache_unavailable",), source="hit", reused=stored()
        )
    )
    result = run.result()
    meta = result.meta
    assert result.docs == (DOC,) and (meta.mode, meta.returned) == ("hybrid", 1)
    assert (meta.status, meta.cache, meta.errors, meta.degraded) == (
        "degraded",
        "hit",
        (CACHE_DOWN,),
        ("query_cache_unavailable",),
    )
    assert set(meta.timings_ms) == {"state", "total"}  # this run's, not the stored computation's


@pytest.mark.parametrize(
    ("reused", "status"),
    [
        (stored(), "ok"),
        (stored("degraded", degraded=("rerank_failed",)), "degraded"),
        (stored("failed", "failed", ("leaf_fetch_failed",)), "failed"),
    ],
)
def test_a_reused_result_without_errors_of_this_run_keeps_its_status(reused: RetrievalResult, status: str) -> None:
    run = RunState(inputs())
    run.add(CacheOutcome("query_cache", source="shared", reused=reused))
    meta = run.result().meta
    assert (meta.status, meta.cache, meta.degraded) == (status, "shared", reused.meta.degraded)


def test_outcomes_and_inputs_are_frozen() -> None:
    merged = MergeOutcome("merge", rounds=(MergeRound(1),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        merged.rounds = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs().strategy = "basic"  # type: ignore[misc]
    assert isinstance(RerankStageOutcome("rerank"), StageOutcome)
