"""The per-request deadline: a hanging encoder, Milvus or reranker costs a query its deadline, not a hang.

Real Milvus Lite + SQLite, real HTTP servers that hang. No test measures elapsed
time (that flakes on a loaded machine): the meta record says which stage ran out
and why, and a stage that waited for its own 60 s timeout would say so instead.
"""

from __future__ import annotations

import time
from typing import Any

from strata.config import Settings
from strata.errors import StoreError
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from tests.rag.rerank_server import RerankServer, hang, raw
from tests.support.documents import RESET_QUERY
from tests.support.fakes import HANG_S, HangingQueryEncoder
from tests.support.stores import with_parts


def with_deadline(settings: Settings, ms: int, **sections: Any) -> Settings:
    update = {"retrieval": settings.retrieval.model_copy(update={"deadline_ms": ms})}
    for name, values in sections.items():
        update[name] = getattr(settings, name).model_copy(update=values)
    return settings.model_copy(update=update)


class HangingIndex:
    """The real leaf index whose searches hang until the timeout they are given (a stalled Milvus)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.timeouts: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _stall(self, timeout: float | None) -> None:
        self.timeouts.append(timeout if timeout is not None else float("inf"))
        time.sleep(min(timeout if timeout is not None else HANG_S, HANG_S))
        raise StoreError("Milvus search failed: DEADLINE_EXCEEDED")

    def search_dense_many(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        self._stall(timeout)

    def search_sparse_many(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> Any:
        self._stall(timeout)


def test_a_hanging_encoder_gives_bm25_results_within_the_deadline(demo: Settings, memo_encoder) -> None:
    with RerankServer(path="/v1/embeddings") as server:
        server.behaviour = hang(HANG_S, then=raw("{}"))
        encoder = HangingQueryEncoder(memo_encoder, server.base_url + "/v1")
        # the warm-up would wait for the hung encoder too; this test is about the query
        engine = Retriever(Resources(with_deadline(demo, 1000), encoder=encoder), warm_up_first=False)
        result = engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    meta = result.meta
    assert (meta.status, meta.mode) == ("degraded", "sparse_fallback") and result.docs
    assert {"query_encoder_failed", "deadline_exceeded"} <= set(meta.degraded)
    # the engine gave up on the encoder at its share of the deadline; the encoder's own 60 s timeout would
    # have ended in an EncoderError naming the timeout instead
    assert {e.error for e in meta.errors if e.stage == "encode"} == {"DeadlineExceeded"}, meta.errors


def test_a_stalled_milvus_fails_with_deadline_exceeded_instead_of_hanging(demo: Settings, memo_encoder) -> None:
    resources = Resources(with_deadline(demo, 800), encoder=memo_encoder)
    stalled = HangingIndex(resources.leaf_index)
    engine = Retriever(with_parts(resources, leaf_index=stalled), warm_up_first=False)
    result = engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert result.docs == () and (result.meta.status, result.meta.mode) == ("failed", "failed")
    assert "deadline_exceeded" in result.meta.degraded
    # no hang: each search was given what was left of the 0.8 s (a stalled search lasts its timeout, not 60 s)
    assert stalled.timeouts and all(t <= 0.8 for t in stalled.timeouts)
    assert {e.error for e in result.meta.errors} & {"StoreError", "DeadlineExceeded"}, result.meta.errors


def test_a_hanging_reranker_keeps_the_fused_order_within_the_deadline(demo: Settings, memo_encoder) -> None:
    baseline = Retriever(Resources(demo, encoder=memo_encoder)).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    with RerankServer() as server:
        server.behaviour = hang(HANG_S)
        settings = with_deadline(demo, 1500, rerank={"url": server.url, "read_timeout_s": HANG_S, "max_retries": 3})
        result = Retriever(Resources(settings, encoder=memo_encoder)).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
        assert len(server.requests) == 1  # not retried: the deadline left no time for it
    meta = result.meta
    assert meta.rerank.status == "failed" and "timed out" in meta.rerank.reason
    assert {"rerank_failed", "deadline_exceeded"} <= set(meta.degraded)
    assert [d.content for d in result.docs] == [d.content for d in baseline.docs]


def test_a_clean_query_within_the_deadline_carries_no_reason(demo: Settings, memo_encoder) -> None:
    result = Retriever(Resources(with_deadline(demo, 20_000), encoder=memo_encoder)).retrieve(
        RESET_QUERY, 5, kb_ids=["demo"]
    )
    assert result.meta.status == "ok" and result.meta.degraded == () and result.meta.errors == ()
