"""Two-round auto-merge: L3 leaves into their L2 parent, then L2 chunks into their L1 root.

The document tree used throughout::

    R (L1)  ── P (L2): p1 p2 p3 p4
            ── Q (L2): q1 q2 q3
            ── U (L2): u1 u2
    S (L1)  ── T (L2): t1 t2
            ── W (L2): w1 … w25
"""

from __future__ import annotations

from collections.abc import Collection

import pytest

from strata.rag.candidates import Candidate, Trace
from strata.rag.merge import ScoreMode, apply_merge, collapse, parents_to_fetch
from strata.types import Chunk, MergeRound

KB = "kb-a"


def chunk(chunk_id: str, level: int, parent_id: str | None, root_id: str, child_count: int = 0) -> Chunk:
    text = f"text of {chunk_id}"
    return Chunk(chunk_id, KB, "doc.md", 1, level, parent_id, root_id, 0, text, "Guide", 0, len(text), child_count)


def tree() -> dict[str, Chunk]:
    chunks = [chunk("R", 1, None, "R", 3), chunk("S", 1, None, "S", 2)]
    for l2, root, leaves in [("P", "R", 4), ("Q", "R", 3), ("U", "R", 2), ("T", "S", 2), ("W", "S", 25)]:
        chunks.append(chunk(l2, 2, root, root, leaves))
        chunks += [chunk(f"{l2.lower()}{n}", 3, l2, root) for n in range(1, leaves + 1)]
    return {c.chunk_id: c for c in chunks}


CHUNKS = tree()


def cand(chunk_id: str, score: float) -> Candidate:
    return Candidate(chunk=CHUNKS[chunk_id], score=score, trace=Trace(dense_rank=1, fused_score=score))


def cands(*pairs: tuple[str, float]) -> list[Candidate]:
    return [cand(chunk_id, score) for chunk_id, score in pairs]


def merge_round(
    candidates: list[Candidate],
    *,
    round_no: int = 1,
    min_children: int = 2,
    min_ratio: float = 0.0,
    score_mode: ScoreMode = "max",
    missing: Collection[str] = (),
) -> tuple[list[Candidate], MergeRound]:
    """One round as the retriever runs it: fetch the parents ``parents_to_fetch`` names, then merge."""
    level = 3 if round_no == 1 else 2
    refs = parents_to_fetch(candidates, level=level, min_children=min_children)
    fetched = {parent_id: CHUNKS[parent_id] for _, parent_id in refs if parent_id not in missing}
    return apply_merge(
        candidates,
        fetched,
        round_no=round_no,
        level=level,
        min_children=min_children,
        min_ratio=min_ratio,
        score_mode=score_mode,
    )


def view(candidates: list[Candidate]) -> list[tuple[str, float]]:
    return [(c.chunk_id, c.score) for c in candidates]


# -- round 1: leaves into their L2 parent -------------------------------------


def test_a_single_child_is_not_merged_and_no_parent_is_fetched() -> None:
    candidates = cands(("p1", 0.9), ("q1", 0.8))

    assert parents_to_fetch(candidates, level=3, min_children=2) == []
    merged, record = merge_round(candidates)

    assert view(merged) == [("p1", 0.9), ("q1", 0.8)]
    assert record == MergeRound(round=1, parents_merged=0, children_replaced=0, parents_missing=0)


def test_all_children_present_become_their_parent() -> None:
    merged, record = merge_round(cands(("p1", 0.9), ("p2", 0.8), ("p3", 0.7), ("p4", 0.6)))

    assert view(merged) == [("P", 0.9)]
    assert merged[0].chunk == CHUNKS["P"]
    assert merged[0].merged_from == ("p1", "p2", "p3", "p4")
    assert record == MergeRound(round=1, parents_merged=1, children_replaced=4, parents_missing=0)


def test_only_the_parent_with_enough_children_merges() -> None:
    candidates = cands(("p1", 0.9), ("q1", 0.8), ("p2", 0.7), ("t1", 0.6))

    assert parents_to_fetch(candidates, level=3, min_children=2) == [(KB, "P")]
    merged, record = merge_round(candidates)

    assert view(merged) == [("P", 0.9), ("q1", 0.8), ("t1", 0.6)]
    assert record == MergeRound(round=1, parents_merged=1, children_replaced=2)


def test_min_children_above_the_hits_blocks_the_merge() -> None:
    merged, record = merge_round(cands(("p1", 0.9), ("p2", 0.8)), min_children=3)

    assert view(merged) == [("p1", 0.9), ("p2", 0.8)]
    assert record.parents_merged == 0


def test_the_parent_takes_the_position_and_score_of_its_best_child() -> None:
    candidates = cands(("t1", 0.95), ("p2", 0.8), ("q1", 0.7), ("p1", 0.6))

    merged, _ = merge_round(candidates)

    assert view(merged) == [("t1", 0.95), ("P", 0.8), ("q1", 0.7)]
    assert merged[1].merged_from == ("p2", "p1")


def test_the_merged_parent_keeps_the_best_child_trace_marked_as_merge() -> None:
    best = Candidate(
        CHUNKS["p2"], 0.8, Trace(dense_rank=3, dense_score=0.77, sparse_rank=1, sparse_score=9.5, fused_score=0.8)
    )

    merged, _ = merge_round([best, cand("p1", 0.6)])

    assert merged[0].trace == Trace(3, 0.77, 1, 9.5, fused_score=0.8, score_stage="merge")


@pytest.mark.parametrize(
    ("score_mode", "expected"),
    [("max", 0.9), ("mean", (0.9 + 0.6 + 0.3) / 3)],
)
def test_score_mode_max_takes_the_best_child_and_mean_averages_the_children(
    score_mode: ScoreMode, expected: float
) -> None:
    candidates = cands(("p1", 0.9), ("t1", 0.7), ("p2", 0.6), ("p3", 0.3))

    merged, _ = merge_round(candidates, score_mode=score_mode)

    assert [c.chunk_id for c in merged] == ["P", "t1"]
    assert merged[0].score == pytest.approx(expected)


def test_min_ratio_blocks_a_parent_whose_hits_are_too_small_a_share_of_its_children() -> None:
    candidates = cands(("p1", 0.9), ("p2", 0.8))  # 2 of P's 4 children

    blocked, record = merge_round(candidates, min_ratio=0.75)
    allowed, _ = merge_round(candidates, min_ratio=0.5)

    assert view(blocked) == [("p1", 0.9), ("p2", 0.8)]
    assert record == MergeRound(round=1, parents_merged=0, children_replaced=0, parents_missing=0)
    assert view(allowed) == [("P", 0.9)]


def test_min_ratio_allows_a_share_exactly_at_the_threshold() -> None:
    # 7 of W's 25 children are exactly 28 %; 0.28 * 25 is 7.000000000000001 in floating point
    candidates = [cand(f"w{n}", 1 - n / 100) for n in range(1, 8)]

    merged, record = merge_round(candidates, min_ratio=0.28)

    assert view(merged) == [("W", 0.99)]
    assert record.children_replaced == 7


def test_a_parent_missing_from_the_fetch_leaves_its_children_in_place() -> None:
    candidates = cands(("p1", 0.9), ("p2", 0.8), ("q1", 0.7), ("q2", 0.6))

    merged, record = merge_round(candidates, missing={"P"})

    assert view(merged) == [("p1", 0.9), ("p2", 0.8), ("Q", 0.7)]
    assert record == MergeRound(round=1, parents_merged=1, children_replaced=2, parents_missing=1)


def test_a_repeated_leaf_counts_as_one_child() -> None:
    assert parents_to_fetch(cands(("p1", 0.9), ("p1", 0.9)), level=3, min_children=2) == []

    merged, record = merge_round(cands(("p1", 0.9), ("p1", 0.9), ("p2", 0.5)))

    assert view(merged) == [("P", 0.9)]
    assert merged[0].merged_from == ("p1", "p2")
    assert record.children_replaced == 2


def test_leaves_of_a_parent_already_in_the_list_disappear_into_it() -> None:
    candidates = cands(("p1", 0.95), ("P", 0.9), ("p2", 0.8), ("q1", 0.7))

    merged, record = merge_round(candidates)

    assert view(merged) == [("P", 0.9), ("q1", 0.7)]
    assert record == MergeRound(round=1, parents_merged=0, children_replaced=0, parents_missing=0)


def test_collapse_drops_repeats_and_anything_inside_another_candidate() -> None:
    candidates = cands(
        ("t1", 0.9), ("p1", 0.85), ("S", 0.8), ("t1", 0.9), ("W", 0.7), ("w3", 0.6), ("q2", 0.5), ("q2", 0.4)
    )

    assert view(collapse(candidates)) == [("p1", 0.85), ("S", 0.8), ("q2", 0.5)]


# -- round 2: L2 chunks into their L1 root ------------------------------------


def test_round_two_merges_l2_chunks_and_absorbs_a_stray_leaf_of_the_same_root() -> None:
    after_round_one = cands(("u1", 0.95), ("P", 0.8), ("Q", 0.7), ("t1", 0.6))

    merged, record = merge_round(after_round_one, round_no=2)

    assert view(merged) == [("R", 0.95), ("t1", 0.6)]  # the stray leaf's better position and score
    assert merged[0].merged_from == ("P", "Q")
    assert record == MergeRound(round=2, parents_merged=1, children_replaced=3, parents_missing=0)


def test_round_two_ignores_leaves_when_counting_children() -> None:
    # u1 and t1 are leaves: R has one L2 candidate, S has none
    merged, record = merge_round(cands(("P", 0.9), ("u1", 0.8), ("t1", 0.7)), round_no=2)

    assert view(merged) == [("P", 0.9), ("u1", 0.8), ("t1", 0.7)]
    assert record == MergeRound(round=2)


def test_two_rounds_turn_leaves_of_two_sections_into_their_chapter() -> None:
    leaves = cands(("p1", 0.9), ("t1", 0.85), ("q1", 0.8), ("p2", 0.7), ("q2", 0.6), ("q3", 0.5))

    sections, first = merge_round(leaves, round_no=1)
    chapters, second = merge_round(sections, round_no=2)

    assert view(sections) == [("P", 0.9), ("t1", 0.85), ("Q", 0.8)]
    assert first == MergeRound(round=1, parents_merged=2, children_replaced=5, parents_missing=0)
    assert view(chapters) == [("R", 0.9), ("t1", 0.85)]
    assert chapters[0].merged_from == ("P", "Q")
    assert chapters[0].trace.score_stage == "merge"
    assert second == MergeRound(round=2, parents_merged=1, children_replaced=2, parents_missing=0)


# -- what hit, and how long a merged parent may be ------------------------------


def spanned(chunk_id: str, level: int, parent_id: str | None, start: int, end: int, child_count: int = 0) -> Chunk:
    return Chunk(
        chunk_id, KB, "page.md", 1, level, parent_id, "L", 0, "x" * (end - start), "Page", start, end, child_count
    )


PAGE = {
    c.chunk_id: c
    for c in [
        spanned("L", 1, None, 0, 900, 3),
        *(spanned(l2, 2, "L", 300 * i, 300 * (i + 1), 3) for i, l2 in enumerate("ABC")),
        *(
            spanned(f"{l2.lower()}{n}", 3, l2, 300 * i + 100 * n, 300 * i + 100 * (n + 1))
            for i, l2 in enumerate("ABC")
            for n in range(3)
        ),
    ]
}


def page_round(candidates: list[Candidate], level: int, **bounds: int) -> list[Candidate]:
    merged, _ = apply_merge(candidates, PAGE, round_no=4 - level, level=level, min_children=2, **bounds)
    return merged


def test_a_merged_parent_spans_from_its_first_hit_leaf_to_its_last_one_stray_leaves_included() -> None:
    leaves = [Candidate(PAGE[i], s) for i, s in [("a1", 0.9), ("b2", 0.8), ("a2", 0.7), ("b1", 0.6), ("c2", 0.5)]]

    sections = page_round(leaves, 3)
    assert [(c.chunk_id, c.hits()) for c in sections] == [("A", (100, 300)), ("B", (400, 600)), ("c2", (800, 900))]
    page = page_round(sections, 2)
    assert [(c.chunk_id, c.hits()) for c in page] == [("L", (100, 900))]  # the stray c2 widened it
    assert leaves[0].hits() == (100, 200)  # a leaf's hit is itself


def test_a_parent_longer_than_max_parent_chars_leaves_its_children_in_place() -> None:
    leaves = [Candidate(PAGE[i], s) for i, s in [("a1", 0.9), ("a2", 0.8), ("b1", 0.7), ("b2", 0.6)]]
    sections = page_round(leaves, 3, max_parent_chars=300)

    assert [c.chunk_id for c in sections] == ["A", "B"]  # 300 characters each: at the bound, merged
    assert [c.chunk_id for c in page_round(sections, 2, max_parent_chars=899)] == ["A", "B"]
    assert [c.chunk_id for c in page_round(sections, 2, max_parent_chars=900)] == ["L"]
