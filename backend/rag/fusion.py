"""Reciprocal-rank fusion of the dense and BM25 routes (pure).

``score(d) = Σ_r w_r / (k + rank_r(d))`` over the routes that returned ``d``
(ranks are 1-based). Plain RRF uses ``w = 1`` for both routes; weighted RRF
uses ``vector_weight`` / ``keyword_weight``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from backend.rag.candidates import Candidate, Trace
from backend.stores.milvus import LeafHit


@dataclass(frozen=True)
class FusionWeights:
    dense: float = 1.0
    sparse: float = 1.0


def rrf_fuse(
    dense: Sequence[LeafHit],
    sparse: Sequence[LeafHit],
    *,
    k: int = 60,
    limit: int,
    weights: FusionWeights = FusionWeights(),
) -> list[Candidate]:
    """The top ``limit`` leaves by (weighted) RRF, each with its per-route trace.

    Ties are broken by the better single-route rank, then by chunk id, so the
    order is deterministic.
    """
    chunks, dense_seen, sparse_seen = {}, {}, {}
    for rank, hit in enumerate(_unique(dense), start=1):
        chunks.setdefault(hit.chunk.chunk_id, hit.chunk)
        dense_seen[hit.chunk.chunk_id] = (rank, hit.score)
    for rank, hit in enumerate(_unique(sparse), start=1):
        chunks.setdefault(hit.chunk.chunk_id, hit.chunk)
        sparse_seen[hit.chunk.chunk_id] = (rank, hit.score)
    fused = []
    for chunk_id, chunk in chunks.items():
        d_rank, d_score = dense_seen.get(chunk_id, (None, None))
        s_rank, s_score = sparse_seen.get(chunk_id, (None, None))
        score = (weights.dense / (k + d_rank) if d_rank else 0.0) + (weights.sparse / (k + s_rank) if s_rank else 0.0)
        trace = Trace(d_rank, d_score, s_rank, s_score, fused_score=score)
        fused.append(Candidate(chunk=chunk, score=score, trace=trace))
    fused.sort(key=lambda c: (-c.score, _best_rank(c.trace), c.chunk_id))
    return fused[:limit]


def single_route(hits: Sequence[LeafHit], *, route: str, k: int = 60, limit: int) -> list[Candidate]:
    """Candidates from one route (a fallback path), scored by RRF so scales stay comparable."""
    if route == "dense":
        return rrf_fuse(hits, [], k=k, limit=limit)
    if route == "sparse":
        return rrf_fuse([], hits, k=k, limit=limit)
    raise ValueError(f"unknown route {route!r} (dense or sparse)")


def _unique(hits: Sequence[LeafHit]) -> list[LeafHit]:
    seen: set[str] = set()
    out = []
    for hit in hits:
        if hit.chunk.chunk_id not in seen:
            seen.add(hit.chunk.chunk_id)
            out.append(hit)
    return out


def _best_rank(trace: Trace) -> int:
    return min(r for r in (trace.dense_rank, trace.sparse_rank, 10**9) if r is not None)
