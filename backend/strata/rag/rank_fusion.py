"""Reciprocal-rank fusion of any number of ranked lists (pure).

``score(x) = Σ_i w_i / (k + rank_i(x))`` over the lists that hold ``x``
(ranks are 1-based and count distinct items: an item repeated inside one
list counts once, at its first position, and does not push the items after it
down). Ties go to the best single-list rank, then to the id, so the
order never depends on which list an item came from.

The two-route fusion of dense and BM25 hits (``strata.rag.route_fusion``), the
``fusion`` strategy's query variants and the fusion of a custom retriever's
results with strata's are all calls of ``reciprocal_rank_fusion``;
``fuse_candidates`` and ``fuse_documents`` are that call on ``Candidate`` and
``RetrievedDocument`` lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from strata.errors import InvalidArgumentError
from strata.rag.candidates import Candidate
from strata.types import RetrievedDocument

T = TypeVar("T")

_NO_RANK = 10**9


@dataclass(frozen=True)
class Fused(Generic[T]):
    """One fused item: its id, fused score, and where each input list had it.

    ``ranks[i]`` and ``items[i]`` are the item's 1-based rank in list ``i``
    and the element of list ``i`` it came from (its first occurrence), or
    ``None`` when list ``i`` does not hold it.
    """

    key: str
    score: float
    ranks: tuple[int | None, ...]
    items: tuple[T | None, ...]

    @property
    def item(self) -> T:
        """The element from the first list that holds the item."""
        return next(i for i, r in zip(self.items, self.ranks) if r is not None and i is not None)

    @property
    def best_rank(self) -> int:
        return min((r for r in self.ranks if r is not None), default=_NO_RANK)


def reciprocal_rank_fusion(
    lists: Sequence[Sequence[T] | None],
    *,
    k: float = 60,
    weights: Sequence[float] | None = None,
    limit: int | None = None,
    key: Callable[[T], str] | None = None,
    normalize: bool = False,
) -> list[Fused[T]]:
    """The items of ``lists`` fused by (weighted) RRF, best first.

    ``key`` gives an item's id (default: the item is its own id, e.g. a chunk
    id string). ``weights`` has one weight per list (default 1 each);
    ``limit`` keeps the best ``limit`` (default all). A ``None`` list did not
    run (an empty list ran and found nothing). With ``normalize`` the score is
    divided by the best possible one, ``Σ w_i / (k + 1)`` over the lists that
    ran, so it lies in (0, 1] and 1.0 means "first in every list that ran".
    Sorted by score descending, then best single-list rank, then id.
    """
    if k < 0:
        raise InvalidArgumentError(f"k must be >= 0 (got {k})")
    if limit is not None and limit < 0:
        raise InvalidArgumentError(f"limit must be >= 0 (got {limit})")
    if weights is not None and len(weights) != len(lists):
        raise InvalidArgumentError(f"{len(weights)} weights for {len(lists)} lists")
    id_of: Callable[[Any], str] = key or _identity
    ranks = [_first_ranks(ranked or (), id_of) for ranked in lists]
    order = list(dict.fromkeys(item_id for per_list in ranks for item_id in per_list))
    fused = [_fuse_one(item_id, ranks, k, weights) for item_id in order]
    if normalize:
        best = math.fsum(w for w, ranked in zip(weights or [1.0] * len(lists), lists) if ranked is not None) / (k + 1)
        fused = [replace(f, score=f.score / best) for f in fused] if best > 0 else []
    fused.sort(key=lambda f: (-f.score, f.best_rank, f.key))
    return fused if limit is None else fused[:limit]


def _first_ranks(ranked: Sequence[T], id_of: Callable[[T], str]) -> dict[str, tuple[int, T]]:
    """Item id -> (1-based rank among the list's distinct items, its first element)."""
    seen: dict[str, tuple[int, T]] = {}
    for element in ranked:
        seen.setdefault(id_of(element), (len(seen) + 1, element))
    return seen


def _fuse_one(
    item_id: str, ranks: list[dict[str, tuple[int, T]]], k: float, weights: Sequence[float] | None
) -> Fused[T]:
    found = [per_list.get(item_id) for per_list in ranks]
    terms = [(weights[i] if weights is not None else 1.0) / (k + hit[0]) for i, hit in enumerate(found) if hit]
    return Fused(
        key=item_id,
        score=math.fsum(terms),  # correctly rounded: independent of list order, and a + b exactly for two lists
        ranks=tuple(h[0] if h else None for h in found),
        items=tuple(h[1] if h else None for h in found),
    )


def _identity(item: Any) -> str:
    return item


def document_key(doc: RetrievedDocument) -> str:
    """A document's identity across retrievers: its chunk id, else its text."""
    return str(doc.metadata.get("chunk_id") or doc.content)


def fuse_documents(
    results: Sequence[Sequence[RetrievedDocument]],
    *,
    k: float = 60,
    weights: Sequence[float] | None = None,
    limit: int | None = None,
) -> list[RetrievedDocument]:
    """Documents of several retrievers fused by RRF (the same document once).

    Each fused document is the first list's copy of it with ``score`` set to
    the fused score and ``metadata["fusion"]`` holding ``{"score", "ranks"}``
    (one rank per input list, ``None`` where that list missed it).
    """
    fused = reciprocal_rank_fusion(results, k=k, weights=weights, limit=limit, key=document_key)
    return [
        replace(
            f.item, score=f.score, metadata={**f.item.metadata, "fusion": {"score": f.score, "ranks": list(f.ranks)}}
        )
        for f in fused
    ]


def fuse_candidates(
    lists: Sequence[Sequence[Candidate] | None],
    *,
    k: float = 60,
    weights: Sequence[float] | None = None,
    limit: int | None = None,
) -> list[Candidate]:
    """Candidates of several searches (e.g. one per query variant) fused by normalized RRF.

    Each fused candidate is the copy from the list where it ranked best (the
    first such list on a tie), keeping that search's trace, with ``score`` and
    ``trace.fused_score`` set to the fused score in (0, 1].
    """
    fused = reciprocal_rank_fusion(lists, k=k, weights=weights, limit=limit, key=_candidate_id, normalize=True)
    return [_best_copy(f) for f in fused]


def _candidate_id(cand: Candidate) -> str:
    return cand.chunk_id


def _best_copy(fused: Fused[Candidate]) -> Candidate:
    best = min((r, i) for i, r in enumerate(fused.ranks) if r is not None)[1]
    cand = fused.items[best]
    assert cand is not None
    return replace(cand, score=fused.score, trace=replace(cand.trace, fused_score=fused.score))
