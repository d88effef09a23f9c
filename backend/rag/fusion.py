"""Reciprocal-rank fusion of the dense and BM25 routes (pure).

``rrf(d) = Σ_r w_r / (k + rank_r(d))`` over the routes that returned ``d``
(ranks are 1-based). Plain RRF uses ``w = 1`` for both routes; weighted RRF
uses ``vector_weight`` / ``keyword_weight``.

The fused score is ``rrf(d)`` divided by the best score possible on the
routes that ran (``Σ_r w_r / (k + 1)``), so it lies in (0, 1] and means the
same on every path: 1.0 is "ranked first by every route that ran", whether
that was both routes or one of them after a fallback. ``min_fused_score``
cuts on this scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from backend.rag.candidates import Candidate, Trace
from backend.types import LeafHit


@dataclass(frozen=True)
class FusionWeights:
    dense: float = 1.0
    sparse: float = 1.0


def rrf_fuse(
    dense: Sequence[LeafHit] | None,
    sparse: Sequence[LeafHit] | None,
    *,
    k: int = 60,
    limit: int,
    weights: FusionWeights = FusionWeights(),
) -> list[Candidate]:
    """The top ``limit`` leaves by normalized (weighted) RRF, each with its per-route trace.

    ``None`` for a route means it did not run (an empty list: it ran and found
    nothing). Ties are broken by the better single-route rank, then by chunk
    id, so the order is deterministic.
    """
    best = sum(w for w, hits in ((weights.dense, dense), (weights.sparse, sparse)) if hits is not None) / (k + 1)
    if best <= 0:
        return []
    chunks, dense_seen, sparse_seen = {}, {}, {}
    for rank, hit in enumerate(_unique(dense or ()), start=1):
        chunks.setdefault(hit.chunk.chunk_id, hit.chunk)
        dense_seen[hit.chunk.chunk_id] = (rank, hit.score)
    for rank, hit in enumerate(_unique(sparse or ()), start=1):
        chunks.setdefault(hit.chunk.chunk_id, hit.chunk)
        sparse_seen[hit.chunk.chunk_id] = (rank, hit.score)
    fused = []
    for chunk_id, chunk in chunks.items():
        d_rank, d_score = dense_seen.get(chunk_id, (None, None))
        s_rank, s_score = sparse_seen.get(chunk_id, (None, None))
        raw = (weights.dense / (k + d_rank) if d_rank else 0.0) + (weights.sparse / (k + s_rank) if s_rank else 0.0)
        score = raw / best
        trace = Trace(d_rank, d_score, s_rank, s_score, fused_score=score)
        fused.append(Candidate(chunk=chunk, score=score, trace=trace))
    fused.sort(key=lambda c: (-c.score, _best_rank(c.trace), c.chunk_id))
    return fused[:limit]


def single_route(
    hits: Sequence[LeafHit], *, route: str, k: int = 60, limit: int, weights: FusionWeights = FusionWeights()
) -> list[Candidate]:
    """Candidates from one route (a fallback or a single-route configuration), on the same 0-1 scale."""
    if route == "dense":
        return rrf_fuse(hits, None, k=k, limit=limit, weights=weights)
    if route == "sparse":
        return rrf_fuse(None, hits, k=k, limit=limit, weights=weights)
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
