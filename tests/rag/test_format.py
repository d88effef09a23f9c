"""Evidence formatted for a prompt (numbered, bounded) and for an agent tool (compact)."""

from __future__ import annotations

from typing import Any

from strata.rag.format import format_for_context, format_for_tool_output
from strata.types import RetrievedDocument


def doc(content: str, score: float = 0.5, **metadata: Any) -> RetrievedDocument:
    return RetrievedDocument(content=content, score=score, metadata=metadata)


SHORT = [doc("alpha", source="a.md"), doc("bravo charlie", source="b.md"), doc("delta", source="c.md")]
# blocks: "[1] a.md\nalpha" (14 chars), "[2] b.md\nbravo charlie" (22), "[3] c.md\ndelta" (14)
SHORT_FULL = "[1] a.md\nalpha\n\n[2] b.md\nbravo charlie\n\n[3] c.md\ndelta"


def test_context_blocks_are_numbered_and_labelled_with_source_and_heading_path() -> None:
    docs = [
        doc("  Run pip install.\n", source="guide.md", heading_path="Install > Linux"),
        doc("Ask on the forum.", source="faq.md"),
        doc("Loose note.", source="", doc_id="notes-7"),
        doc("Orphan."),
    ]

    assert format_for_context(docs) == (
        "[1] guide.md — Install > Linux\nRun pip install.\n\n"
        "[2] faq.md\nAsk on the forum.\n\n"
        "[3] notes-7\nLoose note.\n\n"
        "[4] unknown\nOrphan."
    )


def test_context_that_fits_is_complete_and_unmarked() -> None:
    assert len(SHORT_FULL) == 54
    assert format_for_context(SHORT, max_chars=54) == SHORT_FULL
    assert format_for_context(SHORT) == SHORT_FULL


def test_a_block_that_does_not_fit_is_cut_to_a_marked_piece_and_later_blocks_are_left_out() -> None:
    long = doc("The first sentence of this page is long enough. The second one is not read.", source="b.md")
    out = format_for_context([SHORT[0], long, SHORT[2]], max_chars=80)

    # 14 + 2 for the first block, 9 for the label: 55 left, 54 for the text and its mark; the cut ends
    # at the last sentence end that fits
    assert out == "[1] a.md\nalpha\n\n[2] b.md\nThe first sentence of this page is long enough.…"
    assert len(out) <= 80
    assert "[3]" not in out


def test_a_piece_too_short_to_read_is_left_out_rather_than_cut() -> None:
    assert format_for_context(SHORT, max_chars=30) == "[1] a.md\nalpha"
    assert format_for_context(SHORT, max_chars=10) == ""


def test_when_no_room_is_left_after_a_whole_block_the_rest_is_left_out() -> None:
    # 38 = the first two blocks and their separator; the third would need at least 2 more
    assert format_for_context(SHORT, max_chars=39) == "[1] a.md\nalpha\n\n[2] b.md\nbravo charlie"


def test_context_never_exceeds_max_chars_and_is_a_marked_prefix_of_the_full_text() -> None:
    for max_chars in range(0, len(SHORT_FULL) + 5):
        out = format_for_context(SHORT, max_chars=max_chars)

        assert len(out) <= max_chars, max_chars
        if out.endswith("…"):
            assert SHORT_FULL.startswith(out[:-1]) and len(out) == max_chars, max_chars
        else:
            assert SHORT_FULL.startswith(out), max_chars


def test_context_of_no_documents_is_empty() -> None:
    assert format_for_context([]) == ""


def test_tool_output_lists_rank_score_level_label_and_text() -> None:
    docs = [
        doc("  Run pip install.\n", score=0.91234, source="guide.md", heading_path="Install > Linux", level=2),
        doc("Ask on the forum.", score=0.5, source="faq.md"),
    ]

    assert format_for_tool_output(docs) == (
        "1. [score 0.9123, L2] guide.md — Install > Linux\n   Run pip install.\n"
        "2. [score 0.5000, L?] faq.md\n   Ask on the forum."
    )


def test_tool_output_shows_max_chunks_and_says_how_many_more_there_are() -> None:
    docs = [doc(f"text {n}", score=1 - n / 10, source=f"s{n}.md", level=3) for n in range(5)]

    out = format_for_tool_output(docs, max_chunks=2)

    assert out == ("1. [score 1.0000, L3] s0.md\n   text 0\n2. [score 0.9000, L3] s1.md\n   text 1\n(3 more not shown)")


def test_tool_output_of_exactly_max_chunks_has_no_more_line() -> None:
    docs = [doc(f"text {n}", source="s.md") for n in range(3)]

    out = format_for_tool_output(docs, max_chunks=3)

    assert out.count("\n   text") == 3
    assert "more not shown" not in out


def test_tool_output_of_no_documents_says_so() -> None:
    assert format_for_tool_output([]) == "No evidence found."
