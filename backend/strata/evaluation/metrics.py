"""Retrieval metrics of docs/evaluation.md §5: per query, per system, and as a table.

A system answers ``retrieve(query, k)`` with ``Item``s, best first. The
per-query functions score one list against one query's gold; ``summarize``
averages ``QueryOutcome`` records (a query's k=5 list, k=10 list and call
latencies) into a ``MetricsReport``; ``markdown_table`` renders reports like
docs/evaluation.md §8.

Choices docs/evaluation.md leaves open, made once here:

- Every list is cut to its first k items before scoring, and the budget
  metrics read the first 10 items of the k=10 list. ``n_returned@k`` alone
  counts what the system returned, so a system that breaks the contract by
  returning more than k shows up there instead of being hidden.
- ``answer_hit@k`` checks item by item: an answer split across two items is a
  miss. ``answer_hit@Bc`` checks the *concatenation* of what was read (docs/evaluation.md:
  "a gold answer lies inside what was read"), so there a split answer counts
  when both halves were read.
- A gold answer whose normalized form is empty is ignored (it would be inside
  every text); a query without answers is never an answer hit.
- Latency percentiles use the nearest-rank method: the p-th percentile of n
  sorted values is the value at 1-based rank ``ceil(p * n / 100)``, always an
  observed time.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from strata.errors import InvalidArgumentError

REPORT_KS = (5, 10)
RANKING_K = 10
ANSWER_BUDGETS = (500, 1500)

_WHITESPACE = re.compile(r"\s+")


def norm(s: str) -> str:
    """``s`` with all whitespace removed (docs/evaluation.md §5)."""
    return _WHITESPACE.sub("", s)


@dataclass(frozen=True)
class Item:
    """One retrieved item: the text handed to the reader and its article."""

    text: str
    doc_id: str

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> Item:
        """An item from a ``retrieve`` result dict (docs/evaluation.md §4: ``text``, ``doc_id``)."""
        return cls(text=str(raw["text"]), doc_id=str(raw["doc_id"]))


def answer_hit(items: Sequence[Item], answers: Iterable[str], k: int) -> bool:
    """Whether one of the first k items contains a gold answer, item by item."""
    _check_k(k)
    gold = _normalized_answers(answers)
    return any(answer in norm(item.text) for item in items[:k] for answer in gold)


def budget_read(items: Sequence[Item], budget_chars: int) -> str:
    """What a reader with a budget of B characters reads.

    The items' whitespace-normalized texts, in order, concatenated and cut at
    B characters (the item crossing B is cut there).
    """
    if budget_chars < 0:
        raise InvalidArgumentError(f"budget must be >= 0 characters, got {budget_chars}")
    return "".join(norm(item.text) for item in items)[:budget_chars]


def answer_hit_budget(items: Sequence[Item], answers: Iterable[str], budget_chars: int) -> bool:
    """Whether a gold answer lies inside the concatenation of what was read.

    An answer straddling the cut is a miss; one spanning two items that were
    both read up to its end is a hit (unlike ``answer_hit``).
    """
    read = budget_read(items, budget_chars)
    return any(answer in read for answer in _normalized_answers(answers))


def first_rank(items: Sequence[Item], doc_id: str, k: int = RANKING_K) -> int | None:
    """1-based position of the first item of ``doc_id`` within the first k, else None.

    Repeats of an article never move it up, and earlier items (repeats
    included) keep occupying their positions.
    """
    _check_k(k)
    for rank, item in enumerate(items[:k], start=1):
        if item.doc_id == doc_id:
            return rank
    return None


def doc_recall(items: Sequence[Item], doc_id: str, k: int) -> bool:
    """Whether an item of ``doc_id`` is among the first k."""
    return first_rank(items, doc_id, k) is not None


def reciprocal_rank(items: Sequence[Item], doc_id: str, k: int = RANKING_K) -> float:
    """1/r for the first rank r of ``doc_id`` within the first k, 0 if absent."""
    rank = first_rank(items, doc_id, k)
    return 0.0 if rank is None else 1.0 / rank


def ndcg(items: Sequence[Item], doc_id: str, k: int = RANKING_K) -> float:
    """Binary article-level nDCG with one relevant article: 1/log2(r+1), 0 if absent."""
    rank = first_rank(items, doc_id, k)
    return 0.0 if rank is None else 1.0 / math.log2(rank + 1)


def chars_at_k(items: Sequence[Item], k: int) -> int:
    """Context cost: the raw (not normalized) length of the first k texts."""
    _check_k(k)
    return sum(len(item.text) for item in items[:k])


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile: the value at 1-based rank ceil(p * n / 100)."""
    if not values:
        raise InvalidArgumentError("percentile of no values")
    if not 0 < p <= 100:
        raise InvalidArgumentError(f"percentile must be in (0, 100], got {p}")
    ordered = sorted(values)
    return ordered[math.ceil(p * len(ordered) / 100) - 1]


@dataclass(frozen=True)
class QueryOutcome:
    """What one system did for one query: both lists, the gold, the call times.

    Latencies are the wall times of ``retrieve(query, 5)`` and
    ``retrieve(query, 10)`` in ms, or None when not measured (for every query).
    """

    query_id: str
    doc_id: str
    answers: tuple[str, ...]
    items_at_5: tuple[Item, ...]
    items_at_10: tuple[Item, ...]
    latency_ms_at_5: float | None = None
    latency_ms_at_10: float | None = None


@dataclass(frozen=True)
class MetricsReport:
    """docs/evaluation.md §5's metrics of one system over ``n_queries`` queries (means, ms)."""

    n_queries: int
    answer_hit_at_5: float
    answer_hit_at_10: float
    answer_hit_at_500c: float
    answer_hit_at_1500c: float
    doc_recall_at_5: float
    doc_recall_at_10: float
    doc_mrr_at_10: float
    doc_ndcg_at_10: float
    chars_at_5: float
    chars_at_10: float
    n_returned_at_5: float
    n_returned_at_10: float
    latency_p50_ms_at_5: float | None
    latency_p95_ms_at_5: float | None
    latency_p50_ms_at_10: float | None
    latency_p95_ms_at_10: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        """JSON-safe mapping keyed by field name."""
        return asdict(self)


def summarize(outcomes: Sequence[QueryOutcome]) -> MetricsReport:
    """Average every docs/evaluation.md §5 metric over the queries' outcomes."""
    if not outcomes:
        raise InvalidArgumentError("no query outcomes to summarize")
    budget_hits = budget_curve(outcomes, ANSWER_BUDGETS)
    p50_at_5, p95_at_5 = _latency_percentiles([o.latency_ms_at_5 for o in outcomes])
    p50_at_10, p95_at_10 = _latency_percentiles([o.latency_ms_at_10 for o in outcomes])
    return MetricsReport(
        n_queries=len(outcomes),
        answer_hit_at_5=_mean(answer_hit(o.items_at_5, o.answers, 5) for o in outcomes),
        answer_hit_at_10=_mean(answer_hit(o.items_at_10, o.answers, 10) for o in outcomes),
        answer_hit_at_500c=budget_hits[500],
        answer_hit_at_1500c=budget_hits[1500],
        doc_recall_at_5=_mean(doc_recall(o.items_at_5, o.doc_id, 5) for o in outcomes),
        doc_recall_at_10=_mean(doc_recall(o.items_at_10, o.doc_id, 10) for o in outcomes),
        doc_mrr_at_10=_mean(reciprocal_rank(o.items_at_10, o.doc_id, 10) for o in outcomes),
        doc_ndcg_at_10=_mean(ndcg(o.items_at_10, o.doc_id, 10) for o in outcomes),
        chars_at_5=_mean(chars_at_k(o.items_at_5, 5) for o in outcomes),
        chars_at_10=_mean(chars_at_k(o.items_at_10, 10) for o in outcomes),
        n_returned_at_5=_mean(len(o.items_at_5) for o in outcomes),
        n_returned_at_10=_mean(len(o.items_at_10) for o in outcomes),
        latency_p50_ms_at_5=p50_at_5,
        latency_p95_ms_at_5=p95_at_5,
        latency_p50_ms_at_10=p50_at_10,
        latency_p95_ms_at_10=p95_at_10,
    )


def budget_curve(outcomes: Sequence[QueryOutcome], budgets: Iterable[int]) -> dict[int, float]:
    """Share of answer hits at each character budget, from the first 10 items of k=10."""
    if not outcomes:
        raise InvalidArgumentError("no query outcomes to score")
    return {
        budget: _mean(answer_hit_budget(o.items_at_10[:RANKING_K], o.answers, budget) for o in outcomes)
        for budget in budgets
    }


ColumnStyle = Literal["count", "ratio", "chars", "items", "ms"]

_FORMATS: dict[str, str] = {
    "count": "{:d}",
    "ratio": "{:.3f}",
    "chars": "{:.0f}",
    "items": "{:.2f}",
    "ms": "{:.1f}",
}
_MISSING = "–"  # docs/evaluation.md §8 prints an en dash for a figure that was not measured


@dataclass(frozen=True)
class Column:
    """One table column: its docs/evaluation.md §8-style label, the report field and its format."""

    label: str
    field: str
    style: ColumnStyle

    def format(self, report: MetricsReport) -> str:
        value = getattr(report, self.field)
        return _MISSING if value is None else _FORMATS[self.style].format(value)


ALL_COLUMNS: tuple[Column, ...] = (
    Column("n", "n_queries", "count"),
    Column("ans@5", "answer_hit_at_5", "ratio"),
    Column("ans@10", "answer_hit_at_10", "ratio"),
    Column("ans@500c", "answer_hit_at_500c", "ratio"),
    Column("ans@1500c", "answer_hit_at_1500c", "ratio"),
    Column("doc@5", "doc_recall_at_5", "ratio"),
    Column("doc@10", "doc_recall_at_10", "ratio"),
    Column("MRR@10", "doc_mrr_at_10", "ratio"),
    Column("nDCG@10", "doc_ndcg_at_10", "ratio"),
    Column("chars@5", "chars_at_5", "chars"),
    Column("chars@10", "chars_at_10", "chars"),
    Column("n@5", "n_returned_at_5", "items"),
    Column("n@10", "n_returned_at_10", "items"),
    Column("p50 ms@5", "latency_p50_ms_at_5", "ms"),
    Column("p95 ms@5", "latency_p95_ms_at_5", "ms"),
    Column("p50 ms@10", "latency_p50_ms_at_10", "ms"),
    Column("p95 ms@10", "latency_p95_ms_at_10", "ms"),
)
_COLUMNS_BY_LABEL = {c.label: c for c in ALL_COLUMNS}
SPEC_COLUMNS: tuple[Column, ...] = tuple(
    _COLUMNS_BY_LABEL[label]
    for label in (
        "ans@5",
        "ans@10",
        "ans@500c",
        "ans@1500c",
        "doc@5",
        "MRR@10",
        "nDCG@10",
        "chars@5",
        "p50 ms@10",
    )
)


def markdown_table(rows: Mapping[str, MetricsReport], columns: Sequence[Column] = SPEC_COLUMNS) -> str:
    """A Markdown table, one row per system, like docs/evaluation.md §8 (no trailing newline).

    Ratios get 3 decimals, characters are rounded to integers, mean item
    counts get 2 decimals, milliseconds 1; an unmeasured latency prints "–".
    """
    lines = [
        "| system | " + " | ".join(c.label for c in columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for system, report in rows.items():
        cells = [system.replace("|", r"\|"), *(c.format(report) for c in columns)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _normalized_answers(answers: Iterable[str]) -> list[str]:
    return [gold for gold in (norm(answer) for answer in answers) if gold]


def _mean(values: Iterable[float]) -> float:
    collected = list(values)
    return sum(collected) / len(collected)


def _latency_percentiles(latencies: Sequence[float | None]) -> tuple[float | None, float | None]:
    measured = [ms for ms in latencies if ms is not None]
    if not measured:
        return None, None
    if len(measured) != len(latencies):
        raise InvalidArgumentError("latency measured for some queries only; measure all or none")
    return percentile(measured, 50), percentile(measured, 95)


def _check_k(k: int) -> None:
    if k < 1:
        raise InvalidArgumentError(f"k must be >= 1, got {k}")
