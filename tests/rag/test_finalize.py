"""Finalize: the top_k cut, then the minimum-score cut, never backfilled."""

from __future__ import annotations

from strata.rag.candidates import Candidate
from strata.rag.finalize import finalize
from strata.types import Chunk


def cand(chunk_id: str, score: float) -> Candidate:
    text = f"text of {chunk_id}"
    return Candidate(Chunk(chunk_id, "kb", "doc.md", 1, 3, "l2", "l1", 0, text, "", 0, len(text)), score)


def ranked(*scores: float) -> list[Candidate]:
    """Candidates c0, c1, … with these scores, in this order."""
    return [cand(f"c{n}", score) for n, score in enumerate(scores)]


def kept_ids(candidates: tuple[Candidate, ...]) -> list[str]:
    return [c.chunk_id for c in candidates]


def test_top_k_keeps_the_first_candidates_in_order() -> None:
    result = finalize(ranked(0.9, 0.8, 0.7, 0.6, 0.5), top_k=3, min_score=None)

    assert kept_ids(result.kept) == ["c0", "c1", "c2"]
    assert result.dropped_by_min_score == 0


def test_min_score_drops_within_top_k_and_does_not_backfill() -> None:
    # c2 (0.8) is above the threshold but lies past top_k: it must not replace c1
    result = finalize(ranked(0.9, 0.4, 0.8, 0.7), top_k=2, min_score=0.5)

    assert kept_ids(result.kept) == ["c0"]
    assert result.dropped_by_min_score == 1


def test_a_score_equal_to_min_score_is_kept() -> None:
    result = finalize(ranked(0.9, 0.5, 0.49), top_k=3, min_score=0.5)

    assert kept_ids(result.kept) == ["c0", "c1"]
    assert result.dropped_by_min_score == 1


def test_no_min_score_keeps_every_candidate_of_top_k_whatever_its_score() -> None:
    result = finalize(ranked(0.2, -3.5, 0.0), top_k=3, min_score=None)

    assert kept_ids(result.kept) == ["c0", "c1", "c2"]
    assert result.dropped_by_min_score == 0


def test_fewer_candidates_than_top_k_are_all_kept() -> None:
    result = finalize(ranked(0.9, 0.7), top_k=5, min_score=0.1)

    assert kept_ids(result.kept) == ["c0", "c1"]
    assert result.dropped_by_min_score == 0


def test_everything_under_min_score_leaves_nothing() -> None:
    result = finalize(ranked(0.3, 0.2), top_k=5, min_score=0.5)

    assert result.kept == ()
    assert result.dropped_by_min_score == 2


def test_no_candidates_give_an_empty_result() -> None:
    result = finalize([], top_k=5, min_score=0.5)

    assert (result.kept, result.dropped_by_min_score) == ((), 0)
