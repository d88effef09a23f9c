"""Evidence within a budget of characters (strata.rag.budget): the rule a retrieval's max_chars and
format_for_context share."""

from __future__ import annotations

from typing import Any

import pytest

from strata.errors import InvalidArgumentError
from strata.rag.budget import MIN_PIECE, cut_to, fit_to_budget
from strata.types import RetrievedDocument

pytestmark = pytest.mark.unit

PAGE = (
    "Install the package with pip. It needs Python 3.11.\n"
    "Configure the service in strata.toml. Every key has a default.\n"
    "Set STRATA_API__KEYS to protect the service. Keys are hashed at rest.\n"
    "Restart the service to apply the change. Nothing else is needed."
)


def doc(content: str, **metadata: Any) -> RetrievedDocument:
    return RetrievedDocument(content=content, score=0.5, metadata={"char_start": 0, **metadata})


def test_whole_documents_in_rank_order_while_they_fit() -> None:
    docs = [doc("a" * 50), doc("b" * 60), doc("c" * 10)]

    assert fit_to_budget(docs, 120) == docs
    assert fit_to_budget(docs, 110) == docs[:2]


def test_the_first_document_that_does_not_fit_is_cut_and_later_ones_are_left_out() -> None:
    docs = [doc("a" * 50), doc(PAGE), doc("c" * 10)]

    kept = fit_to_budget(docs, 50 + 100)

    assert [d.content[:1] for d in kept] == ["a", "I"]
    assert sum(len(d.content) for d in kept) <= 150
    # 100 characters of room: the cut ends at the last line or sentence end within them
    assert (
        kept[1].content == "Install the package with pip. It needs Python 3.11.\nConfigure the service in strata.toml."
    )
    assert kept[1].metadata["cut"] is True
    assert (kept[1].metadata["char_start"], kept[1].metadata["char_end"]) == (0, 89)


def test_a_merged_parent_is_cut_to_the_part_that_hit() -> None:
    hit = PAGE.index("Set STRATA_API__KEYS")
    parent = doc(PAGE, char_start=1000, hit_start=1000 + hit, hit_end=1000 + len(PAGE))

    piece = cut_to(parent, 80)

    assert piece is not None
    assert piece.content == "Set STRATA_API__KEYS to protect the service. Keys are hashed at rest."
    assert PAGE[piece.metadata["char_start"] - 1000 : piece.metadata["char_end"] - 1000] == piece.content


def test_a_hit_at_the_very_end_is_read_with_what_comes_before_it() -> None:
    tail = PAGE.index("needed.")
    piece = cut_to(doc(PAGE, hit_start=tail), 70)

    assert piece is not None and piece.content.endswith("Nothing else is needed.")
    assert len(piece.content) <= 70


def test_without_a_sentence_end_in_reach_the_cut_is_hard() -> None:
    piece = cut_to(doc("x" * 500), 100)

    assert piece is not None and piece.content == "x" * 100


def test_a_piece_under_the_minimum_is_left_out() -> None:
    assert cut_to(doc(PAGE), MIN_PIECE - 1) is None
    assert fit_to_budget([doc(PAGE)], MIN_PIECE - 1) == []


def test_every_cut_is_the_documents_own_text_within_the_budget() -> None:
    cuts = 0
    for room in range(MIN_PIECE, len(PAGE) + 1, 7):
        for hit in range(0, len(PAGE), 23):
            piece = cut_to(doc(PAGE, char_start=5, hit_start=5 + hit), room)
            if piece is None:
                continue
            cuts += 1
            assert len(piece.content) <= room
            start, end = piece.metadata["char_start"] - 5, piece.metadata["char_end"] - 5
            assert PAGE[start:end] == piece.content and piece.content == piece.content.strip()
    assert cuts > 100  # nearly every room and hit gives a piece


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "100"])
def test_a_budget_that_is_not_a_positive_integer_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="max_chars"):
        fit_to_budget([], bad)
