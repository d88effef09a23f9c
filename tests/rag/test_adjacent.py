"""Joining consecutive hit leaves into passages: cases, the real chunker, and properties (hypothesis)."""

from __future__ import annotations

import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from strata.config import ChunkingSettings
from strata.indexing.chunking import chunk_document
from strata.rag.adjacent import join_chunks, merge_adjacent_chunks
from strata.rag.candidates import Candidate, Trace
from strata.types import Chunk, SourceDocument

TEXT = "Alpha one. Beta two. Gamma three. Delta four. Epsilon five."


def leaf(
    ordinal: int, start: int, end: int, *, doc: str = "d.md", version: int = 1, kb: str = "kb", parent: str = "p0"
) -> Chunk:
    return Chunk(
        f"{kb}/{doc}/{version}/{ordinal}", kb, doc, version, 3, parent, "r0", ordinal, TEXT[start:end], "H", start, end
    )


def cand(chunk: Chunk, score: float) -> Candidate:
    return Candidate(chunk=chunk, score=score, trace=Trace(dense_rank=1, fused_score=score))


def test_consecutive_leaves_become_one_passage_at_the_best_members_place() -> None:
    alpha, beta, gamma = leaf(0, 0, 10), leaf(1, 11, 20), leaf(2, 21, 33)
    other = leaf(0, 0, 10, doc="other.md")

    out = merge_adjacent_chunks([cand(other, 0.9), cand(beta, 0.8), cand(alpha, 0.5), cand(gamma, 0.3)])

    assert [c.chunk.doc_id for c in out] == ["other.md", "d.md"]
    passage = out[1]
    assert passage.chunk.text == "Alpha one.\nBeta two.\nGamma three."
    assert (passage.chunk.char_start, passage.chunk.char_end) == (0, 33)
    assert passage.merged_from == (alpha.chunk_id, beta.chunk_id, gamma.chunk_id)  # document order
    assert passage.score == 0.8 and passage.trace.score_stage == "adjacent"
    assert out[0].chunk is other


def test_overlapping_characters_appear_once() -> None:
    # "Beta two. Gamma" then "Gamma three. Delta" overlap on "Gamma"
    first, second = leaf(4, 11, 26), leaf(5, 21, 39)

    (passage,) = merge_adjacent_chunks([cand(second, 0.4), cand(first, 0.7)])

    assert passage.chunk.text == TEXT[11:39] == "Beta two. Gamma three. Delta"
    assert passage.score == 0.7


def test_a_gap_in_the_ordinals_keeps_runs_apart() -> None:
    out = merge_adjacent_chunks([cand(leaf(0, 0, 10), 0.9), cand(leaf(2, 21, 33), 0.8), cand(leaf(3, 34, 45), 0.7)])

    assert [c.chunk.text for c in out] == ["Alpha one.", "Gamma three.\nDelta four."]


def test_neighbouring_ordinals_of_other_documents_versions_or_kbs_are_never_joined() -> None:
    pieces = [leaf(0, 0, 10), leaf(1, 11, 20, doc="e.md"), leaf(1, 11, 20, version=2), leaf(1, 11, 20, kb="kb2")]

    out = merge_adjacent_chunks([cand(p, 0.5) for p in pieces])

    assert [c.chunk for c in out] == pieces and all(c.merged_from == () for c in out)


def test_leaves_of_two_parents_join_and_the_passage_claims_neither_parent() -> None:
    a, b = leaf(0, 0, 10, parent="p0"), leaf(1, 11, 20, parent="p1")

    joined = join_chunks([a, b])

    assert joined.parent_id is None and joined.root_id == "r0"
    assert join_chunks([a, leaf(1, 11, 20, parent="p0")]).parent_id == "p0"


def test_a_repeated_leaf_counts_once() -> None:
    a = leaf(0, 0, 10)

    out = merge_adjacent_chunks([cand(a, 0.9), cand(leaf(1, 11, 20), 0.6), cand(a, 0.1)])

    assert len(out) == 1 and out[0].merged_from == (a.chunk_id, leaf(1, 11, 20).chunk_id)


def test_nothing_in_nothing_out() -> None:
    assert merge_adjacent_chunks([]) == []


# -- on the real chunker's leaves ------------------------------------------------------

words = st.text(alphabet="abcxyz", min_size=1, max_size=9)
separators = st.sampled_from([" ", "  ", "\n", "\n\n", ". ", "。", "，"])
texts = st.lists(st.tuples(words, separators), min_size=1, max_size=80).map(lambda p: "".join(w + s for w, s in p))


@settings(max_examples=60, deadline=None)
@given(texts, st.integers(0, 5), st.integers(0, 7), st.data())
def test_real_leaves_join_to_the_documents_text_without_repeating_overlaps(
    text: str, l3_overlap: int, l2_overlap: int, data
) -> None:
    sizes = ChunkingSettings(
        l1_max_chars=60, l2_max_chars=30, l3_max_chars=12, l2_overlap=l2_overlap, l3_overlap=l3_overlap
    )
    chunks = chunk_document(SourceDocument("d.md", "d.md", text, ()), kb_id="kb", version=1, settings=sizes)
    leaves = [c for c in chunks if c.is_leaf]
    start = data.draw(st.integers(0, len(leaves) - 1))
    end = data.draw(st.integers(start + 1, len(leaves)))
    run = leaves[start:end]
    scores = data.draw(st.lists(st.floats(0, 1), min_size=len(run), max_size=len(run)))
    order = data.draw(st.permutations(range(len(run))))

    out = merge_adjacent_chunks([cand(run[i], scores[i]) for i in order])

    assert len(out) == 1
    passage = out[0].chunk
    span = text[run[0].char_start : max(c.char_end for c in run)]
    assert squeeze(passage.text) == squeeze(span)  # every character once, only whitespace rendered differently
    assert out[0].score == max(scores)
    if len(run) > 1:
        assert out[0].merged_from == tuple(c.chunk_id for c in run)


def squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


# -- properties over arbitrary hit lists -----------------------------------------------

hit = st.tuples(st.sampled_from(["d1", "d2"]), st.sampled_from([1, 2]), st.integers(0, 12), st.floats(0, 1))


def as_candidate(doc: str, version: int, ordinal: int, score: float) -> Candidate:
    start = ordinal * 10
    chunk = Chunk(
        f"{doc}/{version}/{ordinal}", "kb", doc, version, 3, None, "r", ordinal, "x" * 8, "H", start, start + 8
    )
    return cand(chunk, score)


@settings(deadline=None)
@given(st.lists(hit, max_size=20))
def test_every_hit_leaf_is_in_exactly_one_passage_of_its_own_document_version(hits: list) -> None:
    candidates = [as_candidate(*h) for h in hits]

    out = merge_adjacent_chunks(candidates)

    covered = [leaf_id for c in out for leaf_id in (c.merged_from or (c.chunk_id,))]
    assert sorted(covered) == sorted({c.chunk_id for c in candidates})
    for passage in out:
        owners = {leaf_id.rsplit("/", 1)[0] for leaf_id in passage.merged_from}
        assert len(owners) <= 1  # never across documents or versions


@settings(deadline=None)
@given(st.lists(hit, max_size=20))
def test_runs_are_maximal_and_a_sorted_list_stays_sorted(hits: list) -> None:
    candidates = sorted((as_candidate(*h) for h in hits), key=lambda c: -c.score)

    out = merge_adjacent_chunks(candidates)

    ordinals: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for c in out:
        members = [m.rsplit("/", 1) for m in (c.merged_from or (c.chunk_id,))]
        numbers = [int(n) for _, n in members]
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))  # consecutive
        ordinals.setdefault((c.chunk.doc_id, c.chunk.version), []).append((numbers[0], numbers[-1]))
    for spans in ordinals.values():
        spans.sort()
        assert all(later[0] > earlier[1] + 1 for earlier, later in itertools.pairwise(spans))  # no two runs touch
    assert [c.score for c in out] == sorted((c.score for c in out), reverse=True)
