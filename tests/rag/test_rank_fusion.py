"""N-list reciprocal-rank fusion: hand-computed cases and properties (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.rag.candidates import Candidate, Trace
from strata.rag.rank_fusion import Fused, fuse_candidates, fuse_documents, reciprocal_rank_fusion
from strata.rag.route_fusion import FusionWeights, rrf_fuse
from strata.types import Chunk, LeafHit, RetrievedDocument

ranked_ids = st.lists(st.sampled_from("abcdefghij"), max_size=8)


def keys(fused: list[Fused]) -> list[str]:
    return [f.key for f in fused]


def test_three_lists_sum_the_reciprocal_ranks_of_the_lists_holding_an_item() -> None:
    fused = reciprocal_rank_fusion([["a", "b"], ["b", "c"], ["c", "b"]])

    assert keys(fused) == ["b", "c", "a"]
    by_key = {f.key: f for f in fused}
    assert by_key["b"].score == pytest.approx(1 / 62 + 1 / 61 + 1 / 62)
    assert by_key["c"].score == pytest.approx(1 / 62 + 1 / 61)
    assert by_key["a"].score == pytest.approx(1 / 61)
    assert by_key["c"].ranks == (None, 2, 1)


def test_ties_go_to_the_best_single_list_rank_then_to_the_id() -> None:
    # k=1: z (1st once) = 1/2; y (3rd twice) = 1/4 + 1/4 = 1/2; x (1st once) = 1/2
    fused = reciprocal_rank_fusion([["z", "m", "y"], ["x", "n", "y"]], k=1)

    assert keys(fused)[:3] == ["x", "z", "y"]
    assert [f.score for f in fused[:3]] == [0.5, 0.5, 0.5]


def test_weights_and_limit() -> None:
    fused = reciprocal_rank_fusion([["a"], ["b"], ["c"]], weights=[0.2, 0.5, 0.3], limit=2)

    assert keys(fused) == ["b", "c"]
    assert fused[0].score == pytest.approx(0.5 / 61)
    assert reciprocal_rank_fusion([["a"]], limit=0) == []


def test_an_item_repeated_in_one_list_counts_once_and_does_not_push_the_others_down() -> None:
    a, b = reciprocal_rank_fusion([["a", "a", "a", "b"]], k=0)

    assert (a.key, a.score, a.ranks) == ("a", 1.0, (1,))
    assert (b.key, b.score, b.ranks) == ("b", 0.5, (2,))


def test_objects_are_fused_by_their_key_and_each_list_keeps_its_own_element() -> None:
    dense = [("a", 0.9), ("b", 0.8)]
    sparse = [("b", 12.0)]

    fused = reciprocal_rank_fusion([dense, sparse], key=lambda pair: pair[0])

    b = next(f for f in fused if f.key == "b")
    assert b.items == (("b", 0.8), ("b", 12.0)) and b.item == ("b", 0.8)
    a = next(f for f in fused if f.key == "a")
    assert a.items == (("a", 0.9), None) and a.item == ("a", 0.9)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"k": -1}, "k must be"), ({"limit": -1}, "limit must be"), ({"weights": [1.0]}, "1 weights for 2 lists")],
)
def test_bad_arguments_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        reciprocal_rank_fusion([["a"], ["b"]], **kwargs)


@settings(deadline=None)
@given(st.lists(ranked_ids, max_size=5), st.integers(0, 100))
def test_every_distinct_item_appears_once_sorted_by_score(lists: list[list[str]], k: int) -> None:
    fused = reciprocal_rank_fusion(lists, k=k)

    assert sorted(keys(fused)) == sorted({i for ranked in lists for i in ranked})
    assert [f.score for f in fused] == sorted((f.score for f in fused), reverse=True)
    for f in fused:
        expected = sum(1 / (k + list(dict.fromkeys(ranked)).index(f.key) + 1) for ranked in lists if f.key in ranked)
        assert f.score == pytest.approx(expected)


@settings(deadline=None)
@given(st.lists(ranked_ids, min_size=1, max_size=5), st.randoms())
def test_the_order_does_not_depend_on_the_order_of_the_lists(lists: list[list[str]], rnd) -> None:
    shuffled = list(lists)
    rnd.shuffle(shuffled)

    assert keys(reciprocal_rank_fusion(lists, k=1)) == keys(reciprocal_rank_fusion(shuffled, k=1))


routes = st.one_of(st.none(), ranked_ids)


@settings(deadline=None)
@given(routes, routes, st.integers(0, 80), st.integers(0, 12), st.sampled_from([(1.0, 1.0), (0.6, 0.4), (0.3, 0.7)]))
def test_two_route_rrf_fuse_is_a_call_of_the_n_list_fusion(
    dense_ids: list[str] | None, sparse_ids: list[str] | None, k: int, limit: int, w: tuple[float, float]
) -> None:
    """How ``rrf_fuse`` becomes a use of ``reciprocal_rank_fusion``: same ids, scores and traces."""
    dense = None if dense_ids is None else [LeafHit(leaf(i), 1.0 - n / 10) for n, i in enumerate(dense_ids)]
    sparse = None if sparse_ids is None else [LeafHit(leaf(i), 20.0 - n) for n, i in enumerate(sparse_ids)]

    expected = rrf_fuse(dense, sparse, k=k, limit=limit, weights=FusionWeights(*w))
    fused = reciprocal_rank_fusion(
        [dense, sparse], k=k, weights=w, limit=limit, key=lambda h: h.chunk.chunk_id, normalize=True
    )
    actual = [as_candidate(f) for f in fused]

    assert actual == expected  # exact: the same floats, the same tie-breaks


def test_normalized_scores_say_first_in_every_list_that_ran_is_one() -> None:
    both = reciprocal_rank_fusion([["a", "b"], ["a"]], k=20, normalize=True)
    one_ran = reciprocal_rank_fusion([None, ["b", "a"]], k=20, normalize=True)

    assert [(f.key, f.score) for f in both] == [("a", 1.0), ("b", pytest.approx(0.5 * 21 / 22))]
    assert [(f.key, f.score) for f in one_ran] == [("b", 1.0), ("a", pytest.approx(21 / 22))]
    assert one_ran[0].ranks == (None, 1)
    assert reciprocal_rank_fusion([None, None], normalize=True) == []


def leaf(chunk_id: str) -> Chunk:
    return Chunk(chunk_id, "kb", "doc.md", 1, 3, "l2", "l1", 0, f"text {chunk_id}", "A", 0, 6)


def as_candidate(f: Fused[LeafHit]) -> Candidate:
    dense, sparse = f.items
    trace = Trace(
        f.ranks[0], dense.score if dense else None, f.ranks[1], sparse.score if sparse else None, fused_score=f.score
    )
    return Candidate(chunk=f.item.chunk, score=f.score, trace=trace)


def test_documents_of_two_retrievers_fuse_into_one_list_with_their_ranks() -> None:
    ours = [doc("c1", "alpha", 0.9), doc("c2", "beta", 0.5)]
    theirs = [RetrievedDocument("gamma", 3.0, {"source": "web"}), doc("c2", "beta", 0.7)]

    fused = fuse_documents([ours, theirs], k=60)

    assert [d.content for d in fused] == ["beta", "alpha", "gamma"]
    assert fused[0].score == pytest.approx(2 / 62) and fused[0].metadata["fusion"]["ranks"] == [2, 2]
    assert fused[0].metadata["chunk_id"] == "c2"  # the first list's copy, its metadata kept
    assert fused[2].metadata == {"source": "web", "fusion": {"score": pytest.approx(1 / 61), "ranks": [None, 1]}}


def doc(chunk_id: str, text: str, score: float) -> RetrievedDocument:
    return RetrievedDocument(text, score, {"chunk_id": chunk_id, "level": 3})


def test_candidates_of_query_variants_fuse_keeping_the_trace_of_their_best_search() -> None:
    a1 = Candidate(leaf("a"), 0.9, Trace(dense_rank=1, fused_score=0.9))
    b1 = Candidate(leaf("b"), 0.8, Trace(dense_rank=2, fused_score=0.8))
    b2 = Candidate(leaf("b"), 0.7, Trace(sparse_rank=1, fused_score=0.7))
    c2 = Candidate(leaf("c"), 0.6, Trace(sparse_rank=2, fused_score=0.6))

    fused = fuse_candidates([[a1, b1], [b2, c2], None], k=0)

    assert [c.chunk_id for c in fused] == ["b", "a", "c"]
    b = fused[0]
    assert b.score == b.trace.fused_score == pytest.approx((1 / 2 + 1 / 1) / 2)  # best possible: 1/1 + 1/1
    assert b.trace.sparse_rank == 1 and b.trace.dense_rank is None  # the copy from variant 2, where b was 1st
    assert fused[1].score == pytest.approx(0.5) and fused[1].trace.dense_rank == 1
