"""Finalize (pure): keep ``top_k``, then apply the minimum-score cut, without backfilling."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata.rag.candidates import Candidate


@dataclass(frozen=True)
class Finalized:
    kept: tuple[Candidate, ...]
    dropped_by_min_score: int


def finalize(candidates: Sequence[Candidate], *, top_k: int, min_score: float | None) -> Finalized:
    """The first ``top_k`` candidates minus those scoring under ``min_score``.

    Candidates past ``top_k`` never replace the dropped ones: a cut means
    "not good enough", and filling the gap with worse evidence would hide it.
    """
    head = list(candidates[:top_k])
    if min_score is None:
        return Finalized(tuple(head), 0)
    kept = tuple(c for c in head if c.score >= min_score)
    return Finalized(kept, len(head) - len(kept))
