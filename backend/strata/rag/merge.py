"""Auto-merge (pure): a parent replaces its children when enough of them hit.

One round works on one level: round 1 merges L3 leaves into their L2
parent, round 2 merges L2 chunks into their L1 root. A parent is merged when at
least ``min_children`` of its direct children are candidates and, when
``min_ratio`` > 0, they are at least that share of all its children. The
parent absorbs every candidate it contains (its children and any deeper
descendant), takes the best position among them and their best score
(``max``) or the mean of its direct children's scores (``mean``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from statistics import fmean
from typing import Literal

from strata.rag.candidates import Candidate
from strata.types import Chunk, MergeRound

ScoreMode = Literal["max", "mean"]


def children_by_parent(candidates: Sequence[Candidate], *, level: int) -> dict[str, list[Candidate]]:
    """Candidates of ``level`` grouped by parent id, in list order, duplicates once."""
    groups: dict[str, list[Candidate]] = {}
    seen: set[str] = set()
    for cand in candidates:
        if cand.chunk.level != level or not cand.chunk.parent_id or cand.chunk_id in seen:
            continue
        seen.add(cand.chunk_id)
        groups.setdefault(cand.chunk.parent_id, []).append(cand)
    return groups


def parents_to_fetch(candidates: Sequence[Candidate], *, level: int, min_children: int) -> list[tuple[str, str]]:
    """(kb id, parent id) of every parent with at least ``min_children`` children among the candidates."""
    return [
        (children[0].chunk.kb_id, parent_id)
        for parent_id, children in children_by_parent(candidates, level=level).items()
        if len(children) >= min_children
    ]


def apply_merge(
    candidates: Sequence[Candidate],
    parents: Mapping[str, Chunk],
    *,
    round_no: int,
    level: int,
    min_children: int,
    min_ratio: float = 0.0,
    score_mode: ScoreMode = "max",
    max_parent_chars: int | None = None,
) -> tuple[list[Candidate], MergeRound]:
    """The candidate list after one merge round, and what the round did."""
    ordered = collapse(candidates)
    merged: dict[str, Candidate] = {}
    missing = 0
    for parent_id, children in children_by_parent(ordered, level=level).items():
        if len(children) < min_children:
            continue
        parent = parents.get(parent_id)
        if parent is None:
            missing += 1
            continue
        if min_ratio > 0 and len(children) / max(parent.child_count, 1) < min_ratio:  # not n < r*c: 0.28*25 > 7
            continue
        if max_parent_chars is not None and len(parent.text) > max_parent_chars:
            continue
        merged[parent_id] = _merged_parent(parent, children, score_mode)
    result, absorbed = _replace_children(ordered, merged, score_mode)
    return result, MergeRound(
        round=round_no, parents_merged=len(merged), children_replaced=absorbed, parents_missing=missing
    )


def _merged_parent(parent: Chunk, children: list[Candidate], score_mode: ScoreMode) -> Candidate:
    best = children[0]  # lists are best first
    score = best.score if score_mode == "max" else fmean(c.score for c in children)
    spans = [c.hits() for c in children]
    return Candidate(
        chunk=parent,
        score=score,
        trace=replace(best.trace, score_stage="merge"),
        merged_from=tuple(c.chunk_id for c in children),
        hit_span=(min(s for s, _ in spans), max(e for _, e in spans)),
    )


def _replace_children(
    ordered: list[Candidate], merged: Mapping[str, Candidate], score_mode: ScoreMode
) -> tuple[list[Candidate], int]:
    """Puts each merged parent at the position of the first candidate it contains."""
    out: list[Candidate] = []
    placed: dict[str, int] = {}  # merged parent id -> its position in out
    absorbed = 0
    for cand in ordered:
        container = next((a for a in cand.ancestors() if a in merged), None)
        if container is None:
            out.append(cand)
            continue
        absorbed += 1
        if container not in placed:
            placed[container] = len(out)
            parent = merged[container]
            if score_mode == "max":
                parent = replace(parent, score=max(parent.score, cand.score))
            out.append(_widened(parent, cand))
        else:  # a deeper descendant (an L3 of a merged L1) widens the span that hit
            at = placed[container]
            out[at] = _widened(out[at], cand)
    return out, absorbed


def _widened(parent: Candidate, absorbed: Candidate) -> Candidate:
    (start, end), (own_start, own_end) = parent.hits(), absorbed.hits()
    return replace(parent, hit_span=(min(start, own_start), max(end, own_end)))


def collapse(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Drops repeated ids and candidates contained in another candidate of the list."""
    present = {c.chunk_id for c in candidates}
    out, seen = [], set()
    for cand in candidates:
        if cand.chunk_id in seen or any(a in present for a in cand.ancestors()):
            continue
        seen.add(cand.chunk_id)
        out.append(cand)
    return out
