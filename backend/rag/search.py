"""The search stage: query vectors, the dense and BM25 routes, RRF fusion and the fallbacks.

Hybrid search, or the fallbacks the settings allow: dense-only when hybrid
fails, BM25-only when there is no query vector (or dense failed too). A
switched-off fallback is a ``failed`` answer with the reason, never a quieter
route. Every outcome is reported to the run's ``Recorder``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Sequence

import numpy as np

from backend.config import RetrievalSettings
from backend.rag.candidates import Candidate
from backend.rag.deadline import DeadlineExceeded
from backend.rag.fusion import FusionWeights, rrf_fuse, single_route
from backend.rag.recorder import Recorder
from backend.resources import Resources
from backend.stores import filters as expr
from backend.types import LeafHit


# Share of the deadline the encoder leaves for the searches after it (BM25 alone, if it timed out).
ENCODE_KEEPS = 0.4


class RouteSearch:
    """Runs one query's routes against the leaf index of one ``Resources``."""

    def __init__(self, resources: Resources, settings: RetrievalSettings) -> None:
        self._res = resources
        self._cfg = settings
        # The encoder runs in a worker so a hung one costs a query its share of the deadline, not forever.
        self._encoding = ThreadPoolExecutor(max_workers=4, thread_name_prefix="strata-encode")

    def encode(self, run: Recorder, queries: Sequence[str], routes: str) -> list[np.ndarray] | None:
        """Query vectors (one encoder call for every query), or None for BM25-only or when the encoder failed."""
        if routes == "sparse":
            return None
        wait = run.deadline.within(float("inf"), keep_s=ENCODE_KEEPS * run.deadline.budget_s)
        with run.timed("encode"):
            try:
                if wait <= 0:
                    raise DeadlineExceeded("encode")
                job = self._encoding.submit(self._res.encoder.encode_queries, list(queries))
                return list(job.result(timeout=wait))
            except FutureTimeout:
                run.error("encode", DeadlineExceeded("encode"), degraded="query_encoder_failed")
                return None
            except Exception as exc:
                run.error("encode", exc, degraded="query_encoder_failed")
                return None

    def close(self) -> None:
        self._encoding.shutdown(wait=False, cancel_futures=True)

    def search(self, run: Recorder, vector: np.ndarray | None, where: str, bm25_text: str, routes: str) -> list[Candidate]:
        """Hybrid search, or the fallbacks the settings allow: dense-only when hybrid fails,
        BM25-only when there is no query vector (or dense failed too). BM25 searches ``bm25_text``
        (the query plus its synonyms); the dense route embedded the query as given."""
        with run.timed("search"):
            if routes != "hybrid":
                return self._single(run, routes, vector, where, bm25_text)
            if vector is not None:
                fused = self._hybrid(run, vector, where, bm25_text)
                if fused is not None:
                    return fused
                if self._cfg.dense_fallback:
                    dense = self._route(run, "dense", vector, where)
                    if dense is not None:
                        run.mode = "dense_fallback"
                        return single_route(dense, route="dense", k=self._cfg.rrf_k, limit=run.candidate_k, weights=self.weights())
            if not self._cfg.sparse_fallback:
                return run.failed("fallbacks switched off" if vector is not None else "query encoder failed and BM25 fallback is off")
            sparse = self._route(run, "sparse", bm25_text, where)
            if sparse is None:
                return run.failed()
            run.mode = "sparse_fallback"
            return single_route(sparse, route="sparse", k=self._cfg.rrf_k, limit=run.candidate_k, weights=self.weights())

    def weights(self) -> FusionWeights:
        if self._cfg.fusion == "weighted_rrf":
            return FusionWeights(self._cfg.vector_weight, self._cfg.keyword_weight)
        return FusionWeights()

    def _single(self, run: Recorder, route: str, vector: np.ndarray | None, where: str, bm25_text: str) -> list[Candidate]:
        """A deliberately single-route configuration (``routes = dense | sparse``): no fallback."""
        query = vector if route == "dense" else bm25_text
        hits = self._route(run, route, query, where, stage="search") if query is not None else None
        if hits is None:
            return run.failed()
        run.mode = route  # type: ignore[assignment]
        return single_route(hits, route=route, k=self._cfg.rrf_k, limit=run.candidate_k, weights=self.weights())

    def _hybrid(self, run: Recorder, vector: np.ndarray, where: str, bm25_text: str) -> list[Candidate] | None:
        try:
            dense = self._hits("dense", run, vector, where)
            sparse = self._hits("sparse", run, bm25_text, where)
        except Exception as exc:
            run.error("search", exc, degraded="hybrid_search_failed")
            return None
        run.mode = "hybrid"
        run.route_counts(dense=len(dense), sparse=len(sparse))
        fused = rrf_fuse(dense, sparse, k=self._cfg.rrf_k, limit=run.candidate_k, weights=self.weights())
        run.fused = len(fused)
        return fused

    def _route(self, run: Recorder, route: str, query: Any, where: str, *, stage: str = "") -> list[LeafHit] | None:
        try:
            hits = self._hits(route, run, query, where)
        except Exception as exc:
            run.error(stage or f"{route}_fallback", exc)
            return None
        run.route_counts(**{route: len(hits)})
        run.fused = min(len(hits), run.candidate_k)
        return hits

    def _hits(self, route: str, run: Recorder, query: Any, where: str) -> list[LeafHit]:
        index = self._res.leaf_index
        search = index.search_dense if route == "dense" else index.search_sparse
        if run.deadline.expired():
            raise DeadlineExceeded(f"the {route} route")
        limit = self._cfg.route_multiplier * run.candidate_k
        hits = search(query, limit=limit, kb_ids=run.kb_ids, where=where, timeout=run.deadline.remaining())
        prefix = run.filters.source_prefix if run.filters else None
        if prefix and expr.needs_exact_check(prefix):  # LIKE wildcards in the prefix over-match
            hits = [h for h in hits if str(h.chunk.metadata.get("source", "")).startswith(prefix)]
        return hits

