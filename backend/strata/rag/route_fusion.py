"""Reciprocal-rank fusion of one query's two routes, dense and BM25 (pure).

The two-list case of ``strata.rag.rank_fusion.reciprocal_rank_fusion`` (the
generic N-list RRF), with the routes' weights, ``None`` for a route that did not
run, and each candidate's per-route trace.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from strata.rag.candidates import Candidate, Trace
from strata.rag.rank_fusion import Fused, reciprocal_rank_fusion
from strata.types import Chunk, LeafHit


class _Hit(Protocol):
    """A route hit: a ``RouteHit`` (id and score) or a ``LeafHit`` (leaf and score)."""

    @property
    def chunk_id(self) -> str: ...

    @property
    def score(self) -> float: ...


H = TypeVar("H", bound=_Hit)


@dataclass(frozen=True)
class FusionWeights:
    dense: float = 1.0
    sparse: float = 1.0


def rrf_rank(
    dense: Sequence[H] | None,
    sparse: Sequence[H] | None,
    *,
    k: int = 60,
    limit: int,
    weights: FusionWeights = FusionWeights(),
) -> list[Fused[H]]:
    """The top ``limit`` hits by normalized (weighted) RRF, keyed on chunk id.

    A call of the N-list ``reciprocal_rank_fusion`` on the two routes. ``None`` for a route means
    it did not run (an empty list: it ran and found nothing). Ties are broken by the better
    single-route rank, then by chunk id, so the order is deterministic.
    """
    return reciprocal_rank_fusion(
        [dense, sparse], k=k, weights=(weights.dense, weights.sparse), limit=limit, key=_chunk_id, normalize=True
    )


def rrf_fuse(
    dense: Sequence[LeafHit] | None,
    sparse: Sequence[LeafHit] | None,
    *,
    k: int = 60,
    limit: int,
    weights: FusionWeights = FusionWeights(),
) -> list[Candidate]:
    """``rrf_rank`` of hits that carry their leaf: the candidates, each with its per-route trace."""
    return [as_candidate(f, f.item.chunk) for f in rrf_rank(dense, sparse, k=k, limit=limit, weights=weights)]


def as_candidate(fused: Fused[H], chunk: Chunk) -> Candidate:
    """The candidate for a fused hit once its leaf is known."""
    dense, sparse = fused.items
    trace = Trace(
        fused.ranks[0],
        dense.score if dense else None,
        fused.ranks[1],
        sparse.score if sparse else None,
        fused_score=fused.score,
    )
    return Candidate(chunk=chunk, score=fused.score, trace=trace)


def _chunk_id(hit: _Hit) -> str:
    return hit.chunk_id


def single_rank(
    hits: Sequence[H], *, route: str, k: int = 60, limit: int, weights: FusionWeights = FusionWeights()
) -> list[Fused[H]]:
    """One route's hits (a fallback or a single-route configuration), on the same 0-1 scale."""
    if route == "dense":
        return rrf_rank(hits, None, k=k, limit=limit, weights=weights)
    if route == "sparse":
        return rrf_rank(None, hits, k=k, limit=limit, weights=weights)
    # a programming error, not input: the routes come from the strategy table and a validated setting
    raise ValueError(f"unknown route {route!r} (dense or sparse)")
