"""Reciprocal-rank fusion of the dense and BM25 routes (``strata.rag.route_fusion``), with hand-computed scores."""

from __future__ import annotations

import pytest

from strata.rag.candidates import Candidate
from strata.rag.route_fusion import FusionWeights, as_candidate, rrf_fuse, single_rank
from strata.types import Chunk, LeafHit


def leaf(chunk_id: str) -> Chunk:
    text = f"text of {chunk_id}"
    return Chunk(chunk_id, "kb", "doc.md", 1, 3, "l2", "l1", 0, text, "A > B", 0, len(text))


def hit(chunk_id: str, score: float = 0.5) -> LeafHit:
    return LeafHit(chunk=leaf(chunk_id), score=score)


def hits(*chunk_ids: str) -> list[LeafHit]:
    return [hit(c) for c in chunk_ids]


def ids(candidates: list[Candidate]) -> list[str]:
    return [c.chunk_id for c in candidates]


def single_route(hits: list[LeafHit], **options: object) -> list[Candidate]:
    """``single_rank`` of hits that carry their leaf, as the search stage makes candidates of them."""
    return [as_candidate(f, f.item.chunk) for f in single_rank(hits, **options)]  # type: ignore[arg-type]


def scores(candidates: list[Candidate]) -> dict[str, float]:
    return {c.chunk_id: c.score for c in candidates}


def test_score_is_the_sum_of_reciprocal_ranks_over_the_routes_that_found_the_leaf() -> None:
    fused = rrf_fuse(hits("a", "b"), hits("b", "c"), limit=10)

    assert ids(fused) == ["b", "a", "c"]
    best = 2 / 61  # ranked first by both routes
    assert scores(fused) == pytest.approx(
        {
            "b": (1 / 62 + 1 / 61) / best,  # dense rank 2, sparse rank 1
            "a": (1 / 61) / best,  # dense rank 1 only
            "c": (1 / 62) / best,  # sparse rank 2 only
        }
    )
    assert scores(fused)["b"] == pytest.approx(0.0325224749 / best)


def test_a_leaf_found_by_both_routes_beats_a_better_ranked_leaf_of_one_route() -> None:
    # "both" is only 5th and 5th, "solo" is 1st on dense: 2/65 = 0.03077 > 1/61 = 0.01639
    dense = hits("solo", "d2", "d3", "d4", "both")
    sparse = hits("s1", "s2", "s3", "s4", "both")

    fused = rrf_fuse(dense, sparse, limit=3)

    assert ids(fused)[0] == "both"
    assert fused[0].score == pytest.approx((2 / 65) / (2 / 61))


def test_k_is_the_rank_offset_and_defaults_to_60() -> None:
    # both routes ran (BM25 found nothing): the best possible is 2 / (k + 1)
    assert rrf_fuse(hits("a", "b"), [], limit=5)[1].score == pytest.approx((1 / 62) / (2 / 61))
    assert rrf_fuse(hits("a", "b"), [], k=10, limit=5)[1].score == pytest.approx((1 / 12) / (2 / 11))


def test_ties_go_to_the_best_single_route_rank_then_to_the_chunk_id() -> None:
    # With k=1 the scores are exact binary fractions, so the ties are exact:
    # b: 1/4 + 1/4 (3rd on both) = s1: 1/2 (sparse 1st) = z: 1/2 (dense 1st)
    # d2: 1/3 (dense 2nd) = s2: 1/3 (sparse 2nd)
    dense = hits("z", "d2", "b")
    sparse = hits("s1", "s2", "b")

    fused = rrf_fuse(dense, sparse, k=1, limit=10)

    assert ids(fused) == ["s1", "z", "b", "d2", "s2"]
    assert [c.score for c in fused] == [0.5, 0.5, 0.5, 1 / 3, 1 / 3]


def test_the_order_does_not_depend_on_which_route_lists_the_tied_leaves_first() -> None:
    one = rrf_fuse(hits("x", "y"), hits("p", "q"), limit=10)
    other = rrf_fuse(hits("p", "q"), hits("x", "y"), limit=10)

    assert ids(one) == ids(other) == ["p", "x", "q", "y"]


def test_limit_keeps_the_best_candidates() -> None:
    dense = hits("a", "b", "c", "d")
    sparse = hits("d", "c")

    assert ids(rrf_fuse(dense, sparse, limit=2)) == ["d", "c"]  # d: 1/64+1/61 = .03202 > c: 1/63+1/62 = .03200
    assert ids(rrf_fuse(dense, sparse, limit=99)) == ["d", "c", "a", "b"]
    assert rrf_fuse(dense, sparse, limit=0) == []


def test_a_leaf_repeated_inside_one_route_is_counted_once_at_its_first_rank() -> None:
    dense = [hit("a", 0.9), hit("a", 0.4), hit("b", 0.3)]
    sparse = [hit("a", 7.0)]

    fused = rrf_fuse(dense, sparse, limit=10)

    assert ids(fused) == ["a", "b"]
    a = fused[0]
    assert a.score == pytest.approx(1.0)  # first on both routes
    assert (a.trace.dense_rank, a.trace.dense_score) == (1, 0.9)


def test_weighted_rrf_can_reverse_the_plain_order() -> None:
    # plain:    x = 1/61, b = 1/61 (tie, id), a = 1/62            -> b before a
    # weighted: x = .6/61 = .00984, a = .6/62 = .00968, b = .4/61 = .00656 -> a before b
    dense = hits("x", "a")
    sparse = hits("b")

    plain = rrf_fuse(dense, sparse, limit=10)
    weighted = rrf_fuse(dense, sparse, limit=10, weights=FusionWeights(dense=0.6, sparse=0.4))

    assert ids(plain) == ["b", "x", "a"]
    assert ids(weighted) == ["x", "a", "b"]
    assert scores(weighted) == pytest.approx({"x": 0.6, "a": 0.6 * 61 / 62, "b": 0.4})  # best possible: 1.0 / 61


def test_weights_apply_to_a_leaf_found_by_both_routes() -> None:
    fused = rrf_fuse(hits("d1", "a"), hits("a"), limit=10, weights=FusionWeights(dense=0.6, sparse=0.4))

    assert scores(fused)["a"] == pytest.approx((0.6 / 62 + 0.4 / 61) * 61)


def test_trace_records_each_route_rank_and_raw_score_and_the_fused_score() -> None:
    dense = [hit("a", 0.83), hit("b", 0.71)]
    sparse = [hit("b", 12.5)]

    fused = {c.chunk_id: c for c in rrf_fuse(dense, sparse, limit=10)}

    b, a = fused["b"].trace, fused["a"].trace
    assert (b.dense_rank, b.dense_score, b.sparse_rank, b.sparse_score) == (2, 0.71, 1, 12.5)
    assert b.fused_score == fused["b"].score == pytest.approx((1 / 62 + 1 / 61) * 61 / 2)
    assert (a.dense_rank, a.dense_score, a.sparse_rank, a.sparse_score) == (1, 0.83, None, None)
    assert a.fused_score == pytest.approx(0.5)
    assert (a.score_stage, a.rerank_score) == ("fusion", None)
    assert fused["a"].merged_from == ()


def test_candidates_carry_the_hit_chunk() -> None:
    the_hit = hit("a")

    assert rrf_fuse([the_hit], [], limit=1)[0].chunk is the_hit.chunk


def test_no_hits_give_no_candidates() -> None:
    assert rrf_fuse([], [], limit=10) == []


def test_single_dense_route_scores_by_rrf_and_traces_only_dense() -> None:
    fused = single_route([hit("a", 0.9), hit("b", 0.8), hit("c", 0.7)], route="dense", limit=2)

    assert ids(fused) == ["a", "b"]
    assert [c.score for c in fused] == pytest.approx([1.0, 61 / 62])
    assert (fused[1].trace.dense_rank, fused[1].trace.dense_score) == (2, 0.8)
    assert (fused[1].trace.sparse_rank, fused[1].trace.sparse_score) == (None, None)


def test_single_sparse_route_scores_by_rrf_and_traces_only_sparse() -> None:
    fused = single_route([hit("a", 14.0), hit("b", 9.0)], route="sparse", k=10, limit=5)

    assert ids(fused) == ["a", "b"]
    assert [c.score for c in fused] == pytest.approx([1.0, 11 / 12])
    assert (fused[0].trace.sparse_rank, fused[0].trace.sparse_score) == (1, 14.0)
    assert fused[0].trace.dense_rank is None


@pytest.mark.parametrize("weights", [FusionWeights(), FusionWeights(dense=0.6, sparse=0.4)])
def test_one_scale_on_every_path_first_everywhere_that_ran_is_one(weights: FusionWeights) -> None:
    """min_fused_score means the same on hybrid and on a single-route fallback, with or without weights."""
    hybrid = rrf_fuse(hits("a", "b"), hits("a", "c"), k=20, limit=10, weights=weights)
    dense_only = single_route(hits("a", "b"), route="dense", k=20, limit=10, weights=weights)
    sparse_only = single_route(hits("a", "c"), route="sparse", k=20, limit=10, weights=weights)

    assert hybrid[0].score == dense_only[0].score == sparse_only[0].score == pytest.approx(1.0)
    assert dense_only[1].score == pytest.approx(21 / 22)
    assert sparse_only[1].score == pytest.approx(21 / 22)
    assert all(0 < c.score <= 1 for c in hybrid + dense_only + sparse_only)


def test_a_route_that_did_not_run_is_not_part_of_the_best_possible_score() -> None:
    ran_empty = rrf_fuse(hits("a"), [], k=20, limit=5)
    did_not_run = rrf_fuse(hits("a"), None, k=20, limit=5)

    assert ran_empty[0].score == pytest.approx(0.5)  # BM25 ran and did not find "a"
    assert did_not_run[0].score == pytest.approx(1.0)
    assert rrf_fuse(None, None, limit=5) == []
