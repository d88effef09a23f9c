"""``strata eval``: the evaluation of docs/evaluation.md of several retrieval modes over one index.

The corpus (one Markdown document per article) is indexed once into a private
embedded index under ``OUT/index`` (Milvus Lite + SQLite, no Redis), then every
mode (``strata.evaluation.modes``: the strategies by name and docs/evaluation.md §8's rows
``bm25``, ``dense``, ``hybrid+merge``, ``full``) answers every sampled question
at each k. ``fusion`` makes its query variants from
``STRATA_RETRIEVAL__SYNONYMS``; without a dictionary it searches the question
alone and equals ``auto_merge``.

Latency is the wall time of each ``retrieve_documents`` call after 5 warm-up
calls, query encoding included; the encoder's own cost per query is reported
separately (``query_embed_ms_p50``) so it can be subtracted.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.config import Settings, with_overrides
from strata.evaluation.dataset import Query, load_squad, subsample, write_corpus
from strata.evaluation.metrics import Item, QueryOutcome, percentile, summarize
from strata.evaluation.modes import eval_mode
from strata.indexing.pipeline import Indexer
from strata.indexing.report import IndexReport, Progress
from strata.rag.retrieve import Retriever
from strata.resources import Resources

logger = logging.getLogger(__name__)

WARMUP_CALLS = 5


@dataclass
class ModeResult:
    mode: str
    outcomes: list[QueryOutcome] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped: str | None = None


def eval_settings(base: Settings, index_dir: Path, overrides: Mapping[str, Any] | None = None) -> Settings:
    """The caller's settings (and ``overrides``, validated) on a private embedded index (no Redis, no query
    cache, no deadline); ``ConfigError`` names an invalid override."""
    private = {
        "data_dir": index_dir,
        "milvus": {"uri": str(index_dir / "milvus.db"), "isolation": "auto"},
        "database": {"url": f"sqlite:///{index_dir / 'strata.sqlite3'}"},
        "redis": {"url": None},
        # quality is measured without a deadline: a loaded machine must not turn answers into fallbacks
        "retrieval": {"cache_size": 0, "deadline_ms": 600_000},
    }
    return with_overrides(with_overrides(base, overrides or {}), private)


def mode_settings(settings: Settings, mode: str) -> Settings:
    """``settings`` as eval mode ``mode`` runs (``strata.evaluation.modes``)."""
    return with_overrides(settings, eval_mode(mode).overrides())


def build_index(
    settings: Settings, dataset: Path, out_dir: Path, kb_id: str, progress: Progress
) -> tuple[Resources, IndexReport, int]:
    """Writes the corpus and indexes it (incrementally: a rerun re-encodes nothing)."""
    articles, _ = load_squad(dataset)
    corpus = out_dir / "corpus"
    write_corpus(articles, corpus)
    resources = Resources(settings)
    report = Indexer(resources).index_paths([corpus], kb_id=kb_id, progress=progress)
    return resources, report, len(articles)


def index_summary(resources: Resources, report: IndexReport, kb_id: str) -> dict[str, Any]:
    """This run's indexing figures plus what the index holds (a rerun may have changed nothing)."""
    stats = resources.documents.versions.stats(kb_id)
    return {
        **report.to_dict(),
        "reused": report.chunks_written == 0 and report.unchanged > 0,
        "leaves_in_index": resources.leaf_index.count(kb_id),
        "chunks_by_level": stats["chunks_by_level"],
    }


def query_embed_ms_p50(resources: Resources, queries: Sequence[Query], n: int = 50) -> float:
    """The encoder's cost for one query (single text), p50 over ``n`` questions."""
    times = []
    for query in list(queries)[: n + WARMUP_CALLS]:
        started = time.perf_counter()
        resources.encoder.encode_queries([query.question])
        times.append((time.perf_counter() - started) * 1000)
    return percentile(times[WARMUP_CALLS:] or times, 50)


def run_mode(
    resources: Resources,
    mode: str,
    queries: Sequence[Query],
    ks: Sequence[int],
    kb_id: str,
    on_query: Callable[[], None] = lambda: None,
) -> ModeResult:
    """Every query at every k through one mode's ``Retriever``."""
    result = ModeResult(mode)
    if eval_mode(mode).rerank and not resources.settings.rerank.url:
        result.skipped = "STRATA_RERANK__URL is not set"
        return result
    retriever = Retriever(Resources(mode_settings(resources.settings, mode), encoder=resources.encoder))
    for query in list(queries)[:WARMUP_CALLS]:
        for k in ks:
            retriever.retrieve(query.question, k, kb_ids=[kb_id])
    for query in queries:
        result.outcomes.append(_ask(retriever, query, ks, kb_id, result))
        on_query()
    return result


def _ask(retriever: Retriever, query: Query, ks: Sequence[int], kb_id: str, result: ModeResult) -> QueryOutcome:
    lists: dict[int, tuple[Item, ...]] = {}
    latency: dict[int, float] = {}
    for k in ks:
        started = time.perf_counter()
        answer = retriever.retrieve(query.question, k, kb_ids=[kb_id])
        latency[k] = (time.perf_counter() - started) * 1000
        lists[k] = tuple(Item(text=d.content, doc_id=str(d.metadata["doc_id"])) for d in answer.docs)
        status = answer.meta.status
        result.statuses[status] = result.statuses.get(status, 0) + 1
        if status != "ok" and len(result.errors) < 20:
            result.errors.append(f"{query.query_id} k={k}: {status} {list(answer.meta.degraded)}")
    return QueryOutcome(
        query_id=query.query_id,
        doc_id=query.doc_id,
        answers=query.answers,
        items_at_5=lists.get(5, ()),
        items_at_10=lists.get(10, ()),
        latency_ms_at_5=latency.get(5),
        latency_ms_at_10=latency.get(10),
    )


def summarize_modes(results: Sequence[ModeResult]) -> dict[str, Any]:
    return {r.mode: summarize(r.outcomes) for r in results if r.outcomes}


def describe_machine() -> dict[str, Any]:
    import os

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def sampled_queries(dataset: Path, sample: int | None) -> tuple[list[Query], int]:
    _, queries = load_squad(dataset)
    return subsample(queries, sample), len(queries)
