"""docs/evaluation.md §5 metrics on hand-made lists; every expected value was worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from strata.evaluation.metrics import (
    ALL_COLUMNS,
    Item,
    QueryOutcome,
    answer_hit,
    answer_hit_budget,
    budget_curve,
    budget_read,
    chars_at_k,
    doc_recall,
    first_rank,
    markdown_table,
    ndcg,
    norm,
    percentile,
    reciprocal_rank,
    summarize,
)


def items(*pairs: tuple[str, str]) -> list[Item]:
    return [Item(text=text, doc_id=doc_id) for text, doc_id in pairs]


# --- norm and answer_hit@k ---------------------------------------------------


def test_norm_removes_every_kind_of_whitespace() -> None:
    assert norm(" 光荣 和\tω-force\n开发\u3000了 ") == "光荣和ω-force开发了"


def test_answer_with_whitespace_matches_item_with_other_whitespace() -> None:
    returned = items(("由光荣和 ω-force\n开发", "A"))
    assert answer_hit(returned, ["光荣 和ω-force"], k=5)


def test_answer_hit_only_looks_at_the_first_k_items() -> None:
    returned = items(("甲", "A"), ("乙", "B"), ("答案在这里", "C"))
    assert not answer_hit(returned, ["答案"], k=2)
    assert answer_hit(returned, ["答案"], k=3)


def test_answer_split_across_two_items_is_not_an_answer_hit() -> None:
    returned = items(("答案的前", "A"), ("半部分", "A"))
    assert not answer_hit(returned, ["前半"], k=10)


def test_any_of_several_gold_answers_is_a_hit() -> None:
    returned = items(("首都是北京", "A"))
    assert answer_hit(returned, ["上海", "北京"], k=5)
    assert not answer_hit(returned, ["上海", "广州"], k=5)


def test_no_items_or_no_usable_answer_is_never_a_hit() -> None:
    assert not answer_hit([], ["北京"], k=5)
    assert not answer_hit(items(("北京", "A")), [], k=5)
    # A blank answer would otherwise be "inside" every text.
    assert not answer_hit(items(("北京", "A")), [" \n"], k=5)


def test_k_must_be_positive() -> None:
    with pytest.raises(ValueError):
        answer_hit(items(("北京", "A")), ["北京"], k=0)


# --- answer_hit@Bc -------------------------------------------------------------

# Normalized texts: "abcde" (5 chars, 6 raw), "fghij" (5), "klm" (3).
BUDGET_ITEMS = items(("abc de", "A"), ("fgh ij", "B"), ("klm", "C"))


def test_budget_counts_normalized_characters() -> None:
    assert budget_read(BUDGET_ITEMS, 5) == "abcde"
    assert budget_read(BUDGET_ITEMS, 7) == "abcdefg"
    assert budget_read(BUDGET_ITEMS, 100) == "abcdefghijklm"
    assert budget_read(BUDGET_ITEMS, 0) == ""


def test_budget_cut_exactly_at_an_item_boundary() -> None:
    # Counted raw, "abc de" would be cut to "abc d" and "de" would be missed.
    assert answer_hit_budget(BUDGET_ITEMS, ["de"], 5)
    assert not answer_hit_budget(BUDGET_ITEMS, ["ef"], 5)  # f lies past the cut
    assert not answer_hit_budget(BUDGET_ITEMS, ["fg"], 5)


def test_budget_cut_inside_an_item() -> None:
    assert answer_hit_budget(BUDGET_ITEMS, ["fg"], 7)  # entirely before the cut
    assert not answer_hit_budget(BUDGET_ITEMS, ["gh"], 7)  # straddles the cut
    assert not answer_hit_budget(BUDGET_ITEMS, ["kl"], 7)  # item never reached


def test_budget_reads_the_concatenation_so_a_split_answer_counts() -> None:
    assert answer_hit_budget(BUDGET_ITEMS, ["e f"], 7)
    split = items(("答案的前", "A"), ("半部分", "A"))
    assert answer_hit_budget(split, ["前半"], 500)
    assert not answer_hit_budget(split, ["前半"], 4)  # "答案的前" only


def test_budget_with_several_answers_and_no_items() -> None:
    assert answer_hit_budget(BUDGET_ITEMS, ["zz", "cd"], 5)
    assert not answer_hit_budget([], ["a"], 500)
    assert not answer_hit_budget(BUDGET_ITEMS, ["a"], 0)


def test_negative_budget_is_refused() -> None:
    with pytest.raises(ValueError):
        budget_read(BUDGET_ITEMS, -1)


# --- article ranks ---------------------------------------------------------------

# Article A appears at ranks 1 and 3, B at 2 and 5, C at 4.
RANKED = items(("1", "A"), ("2", "B"), ("3", "A"), ("4", "C"), ("5", "B"))


def test_repeats_count_only_at_their_first_rank_and_keep_their_positions() -> None:
    assert first_rank(RANKED, "A") == 1
    assert first_rank(RANKED, "B") == 2
    assert first_rank(RANKED, "C") == 4  # the repeated A at 3 still takes a position
    assert first_rank(RANKED, "D") is None


def test_reciprocal_rank_by_hand() -> None:
    assert reciprocal_rank(RANKED, "A") == 1.0
    assert reciprocal_rank(RANKED, "B") == 0.5
    assert reciprocal_rank(RANKED, "C") == 0.25
    assert reciprocal_rank(RANKED, "D") == 0.0


def test_ndcg_by_hand() -> None:
    assert ndcg(RANKED, "A") == 1.0
    assert ndcg(RANKED, "B") == pytest.approx(0.6309298)  # 1 / log2(3)
    assert ndcg(RANKED, "C") == pytest.approx(0.4306766)  # 1 / log2(5)
    assert ndcg(RANKED, "D") == 0.0


def test_ranks_beyond_k_do_not_count() -> None:
    assert first_rank(RANKED, "C", k=3) is None
    assert reciprocal_rank(RANKED, "C", k=3) == 0.0
    assert ndcg(RANKED, "C", k=3) == 0.0
    assert not doc_recall(RANKED, "C", k=3)
    assert doc_recall(RANKED, "C", k=4)


def test_fewer_than_k_items_and_no_items() -> None:
    two = items(("1", "A"), ("2", "B"))
    assert first_rank(two, "B", k=10) == 2
    assert doc_recall(two, "B", k=10)
    assert first_rank([], "A") is None
    assert not doc_recall([], "A", k=5)
    assert reciprocal_rank([], "A") == 0.0
    assert ndcg([], "A") == 0.0


# --- chars@k ---------------------------------------------------------------------


def test_chars_at_k_counts_raw_length_of_the_first_k_items() -> None:
    returned = items(("ab c", "A"), ("文字", "B"), ("x\n", "C"))
    assert chars_at_k(returned, 2) == 6  # 4 + 2; normalized it would be 5
    assert chars_at_k(returned, 10) == 8  # fewer than k items
    assert chars_at_k([], 5) == 0


# --- percentiles -------------------------------------------------------------------


def test_nearest_rank_percentiles() -> None:
    one_to_twenty = [float(v) for v in range(20, 0, -1)]
    assert percentile(one_to_twenty, 95) == 19.0  # rank ceil(0.95 * 20) = 19
    assert percentile(one_to_twenty, 50) == 10.0  # rank 10
    assert percentile(one_to_twenty, 100) == 20.0
    assert percentile([7.5], 50) == 7.5
    assert percentile([10.0, 30.0], 50) == 10.0  # rank ceil(1.0) = 1, no interpolation
    with pytest.raises(ValueError):
        percentile([], 50)


# --- aggregation -----------------------------------------------------------------


def two_outcomes() -> list[QueryOutcome]:
    # q1: answer in the first item at k=5; at k=10 the gold article is second and
    #     its item "甲 乙" (3 raw chars) holds the answer with a space inside.
    q1 = QueryOutcome(
        query_id="q1",
        doc_id="A",
        answers=("甲乙",),
        items_at_5=tuple(items(("甲乙丙", "A"))),
        items_at_10=tuple(items(("丁", "B"), ("甲 乙", "A"))),
        latency_ms_at_5=10.0,
        latency_ms_at_10=20.0,
    )
    # q2: nothing at k=5; at k=10 a 600-char item of the wrong article comes
    #     first, so the answer is only read once the budget exceeds 600.
    q2 = QueryOutcome(
        query_id="q2",
        doc_id="B",
        answers=("戊",),
        items_at_5=(),
        items_at_10=tuple(items(("x" * 600, "C"), ("戊", "B"))),
        latency_ms_at_5=30.0,
        latency_ms_at_10=40.0,
    )
    return [q1, q2]


def test_summarize_by_hand() -> None:
    report = summarize(two_outcomes())

    assert report.n_queries == 2
    assert report.answer_hit_at_5 == 0.5
    assert report.answer_hit_at_10 == 1.0
    assert report.answer_hit_at_500c == 0.5
    assert report.answer_hit_at_1500c == 1.0
    assert report.doc_recall_at_5 == 0.5
    assert report.doc_recall_at_10 == 1.0
    assert report.doc_mrr_at_10 == 0.5  # both gold articles at rank 2
    assert report.doc_ndcg_at_10 == pytest.approx(1 / math.log2(3))
    assert report.chars_at_5 == 1.5  # (3 + 0) / 2
    assert report.chars_at_10 == 302.5  # (4 + 601) / 2
    assert report.n_returned_at_5 == 0.5
    assert report.n_returned_at_10 == 2.0
    assert (report.latency_p50_ms_at_5, report.latency_p95_ms_at_5) == (10.0, 30.0)
    assert (report.latency_p50_ms_at_10, report.latency_p95_ms_at_10) == (20.0, 40.0)


def test_budget_curve_at_arbitrary_budgets() -> None:
    curve = budget_curve(two_outcomes(), [0, 2, 500, 601, 1500])
    # q1 reads "丁甲乙": the answer is complete from 3 chars on; q2 needs 601.
    assert curve == {0: 0.0, 2: 0.0, 500: 0.5, 601: 1.0, 1500: 1.0}


def test_items_beyond_k_are_ignored_but_counted_as_returned() -> None:
    over = QueryOutcome(
        query_id="q",
        doc_id="F",
        answers=("答案",),
        items_at_5=tuple(items(*[("空", "X")] * 5, ("答案", "F"))),
        items_at_10=tuple(items(*[("空", "X")] * 10, ("答案", "F"))),
    )
    report = summarize([over])
    assert report.answer_hit_at_5 == 0.0
    assert report.doc_recall_at_5 == 0.0
    assert report.answer_hit_at_10 == 0.0
    assert report.answer_hit_at_1500c == 0.0  # the budget reads the first 10 items only
    assert report.doc_mrr_at_10 == 0.0
    assert report.chars_at_5 == 5.0
    assert report.n_returned_at_5 == 6.0  # the broken contract stays visible


def test_unmeasured_latency_is_none_and_partial_latency_is_refused() -> None:
    unmeasured = [QueryOutcome("q", "A", ("a",), (), ())]
    report = summarize(unmeasured)
    assert report.latency_p50_ms_at_10 is None
    assert report.latency_p95_ms_at_5 is None

    partial = [*two_outcomes(), QueryOutcome("q3", "A", ("a",), (), ())]
    with pytest.raises(ValueError):
        summarize(partial)


def test_summarize_refuses_no_queries() -> None:
    with pytest.raises(ValueError):
        summarize([])


def test_item_from_a_retrieve_result_dict() -> None:
    raw = {"text": "正文", "doc_id": 7, "score": 0.3}
    assert Item.from_mapping(raw) == Item(text="正文", doc_id="7")


# --- report rendering ---------------------------------------------------------------


def test_report_dict_is_json_safe() -> None:
    report = summarize(two_outcomes())
    as_dict = json.loads(json.dumps(report.to_dict()))
    assert as_dict["answer_hit_at_500c"] == 0.5
    assert as_dict["answer_hit_at_1500c"] == 1.0
    assert as_dict["doc_mrr_at_10"] == 0.5
    assert as_dict["latency_p50_ms_at_10"] == 20.0
    assert [c.field for c in ALL_COLUMNS] == list(as_dict), "a table column for every metric, in order"


def test_markdown_table_like_spec_section_8() -> None:
    measured = summarize(two_outcomes())
    unmeasured = summarize([QueryOutcome("q", "A", ("a",), tuple(items(("a b", "A"))), ())])

    table = markdown_table({"bm25": measured, "Super|Mew": unmeasured})

    assert table == (
        "| system | ans@5 | ans@10 | ans@500c | ans@1500c | doc@5 | MRR@10 | nDCG@10"
        " | chars@5 | p50 ms@10 |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        "| bm25 | 0.500 | 1.000 | 0.500 | 1.000 | 0.500 | 0.500 | 0.631 | 2 | 20.0 |\n"
        "| Super\\|Mew | 1.000 | 0.000 | 0.000 | 0.000 | 1.000 | 0.000 | 0.000 | 3 | – |"
    )


def test_markdown_table_with_chosen_columns() -> None:
    report = summarize(two_outcomes())
    columns = [c for c in ALL_COLUMNS if c.label in {"n", "chars@10", "n@10", "p95 ms@5"}]
    assert markdown_table({"dense": report}, columns) == (
        "| system | n | chars@10 | n@10 | p95 ms@5 |\n|---|---|---|---|---|\n| dense | 2 | 302 | 2.00 | 30.0 |"
    )
