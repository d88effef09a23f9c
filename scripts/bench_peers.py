"""strata beside its peers on every dev set: one table per set, the same questions and encoder for every system.

    python scripts/bench_peers.py eval/docs-dev/zh/docs_dev_zh.json eval/docs-dev/en/docs_dev_en.json \\
        PATH/TO/cmrc2018_dev.json --sample 1000 --out bench-out/peers

Systems, each on its own index of the same corpus (docs/evaluation.md §2) and scored by
``strata.evaluation.metrics`` on the same sampled questions (``--sample``, seed 13; a set with fewer questions
is asked in full):

- ``strata default``: ``strata eval``'s ``hybrid+merge`` mode (the default path without rerank) on
  ``OUT/SET/index`` (the ``strata eval --out OUT/SET`` folder, so a ``strata eval`` run's index is reused);
- ``flat hybrid``: ``scripts/bench_flat_baseline.py``, docs/evaluation.md §6's reference recipe
  (``OUT/SET/flat-baseline``);
- ``LlamaIndex auto-merge``: ``strata.evaluation.auto_merge_peer``, LlamaIndex's ``HierarchicalNodeParser``
  (2048/512/128 tokens) and ``AutoMergingRetriever`` (ratio 0.5) by their own recipe, over the same encoder
  (``OUT/SET/llamaindex``, LlamaIndex's persisted storage).

Indexes are reused when their data and recipe are unchanged, so a rerun only asks the questions.
``--set KEY=VALUE`` (repeatable, e.g. ``retrieval.merge_max_chars=1000``) changes strata's settings for a
variant; a chunking change needs an ``--out`` of its own, since the index is rebuilt for it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from _bench import machine, quiet_logging
from bench_flat_baseline import flat_outcomes
from strata.config import load_settings
from strata.evaluation.dataset import load_squad
from strata.evaluation.metrics import ALL_COLUMNS, Column, MetricsReport, QueryOutcome, markdown_table, summarize
from strata.evaluation.runner import build_index, eval_settings, run_mode, sampled_queries
from strata.indexing.report import NoProgress
from strata.resources import Resources

KS = (5, 10)
KB = "eval"
SYSTEMS = ("strata", "flat", "llamaindex")
LABELS = {"strata": "strata default (hybrid+merge)", "flat": "flat hybrid", "llamaindex": "LlamaIndex auto-merge"}
COLUMNS: tuple[Column, ...] = tuple(
    c for c in ALL_COLUMNS if c.label in ("ans@5", "ans@500c", "ans@1500c", "nDCG@10", "chars@5", "n@10")
)


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """``a.b=value`` pairs as nested settings overrides (values parsed as JSON when they can be)."""
    import json

    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        *sections, name = key.split(".")
        node = overrides
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = value
    return overrides


def strata_outcomes(
    dataset: Path, out: Path, sample: int | None, overrides: dict[str, Any]
) -> tuple[list[QueryOutcome], int, Resources]:
    settings = eval_settings(load_settings(), out / "index", overrides)
    started = time.perf_counter()
    resources, report, _ = build_index(settings, dataset, out, KB, NoProgress())
    leaves = resources.leaf_index.count(KB)
    print(
        f"  strata index: {leaves} leaves, {report.chunks_written} chunks written in {time.perf_counter() - started:.0f} s"
    )
    queries, _ = sampled_queries(dataset, sample)
    result = run_mode(resources, "hybrid+merge", queries, KS, KB)
    if result.errors:
        print(f"  strata: {len(result.errors)} answers not ok, first: {result.errors[0]}")
    return result.outcomes, leaves, resources


def llamaindex_outcomes(
    dataset: Path, out: Path, sample: int | None, resources: Resources
) -> tuple[list[QueryOutcome], int]:
    from strata.evaluation.auto_merge_peer import EncoderEmbedding, load_or_build_peer

    articles, _ = load_squad(dataset)
    embedding = EncoderEmbedding(resources.encoder)
    started = time.perf_counter()
    peer, reused = load_or_build_peer(articles, embedding, resources.encoder, out / "llamaindex")
    verb = "reused" if reused else "built"
    print(f"  LlamaIndex: {peer.nodes} nodes, {peer.leaves} leaves, {verb} in {time.perf_counter() - started:.0f} s")
    queries, _ = sampled_queries(dataset, sample)
    outcomes = []
    for query in queries:
        lists = {k: peer.retrieve(query.question, k) for k in KS}
        outcomes.append(QueryOutcome(query.query_id, query.doc_id, query.answers, lists[5], lists[10]))
    return outcomes, peer.leaves


def bench_set(dataset: Path, out: Path, sample: int | None, systems: Sequence[str], overrides: dict[str, Any]) -> str:
    """The table of one set: every system asked the same questions."""
    queries, total = sampled_queries(dataset, sample)
    rows: dict[str, MetricsReport] = {}
    leaves: dict[str, int] = {}
    resources: Resources | None = None
    runs: dict[str, Callable[[], tuple[list[QueryOutcome], int]]] = {
        "flat": lambda: flat_outcomes(dataset, out, sample)[:2],
        "llamaindex": lambda: llamaindex_outcomes(dataset, out, sample, resources_for_peer()),
    }

    def resources_for_peer() -> Resources:
        nonlocal resources
        if resources is None:
            resources = Resources(eval_settings(load_settings(), out / "index", overrides))
        return resources

    try:
        for system in systems:
            started = time.perf_counter()
            if system == "strata":
                outcomes, leaves[system], resources = strata_outcomes(dataset, out, sample, overrides)
            else:
                outcomes, leaves[system] = runs[system]()
            rows[LABELS[system]] = summarize(outcomes)
            row = markdown_table({LABELS[system]: rows[LABELS[system]]}, COLUMNS).splitlines()[-1]
            print(f"  {time.perf_counter() - started:.0f} s: {row}", file=sys.stderr)  # kept if a later system fails
    finally:
        if resources is not None:
            resources.close()
    title = f"{dataset.name}: {len(queries)} of {total} questions; leaves " + ", ".join(
        f"{LABELS[s]} {leaves[s]:,}" for s in systems
    )
    return title + "\n\n" + markdown_table(rows, COLUMNS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("datasets", type=Path, nargs="+", help="SQuAD-style files (docs/evaluation.md §1)")
    parser.add_argument("--out", type=Path, required=True, help="one folder per set is made under it")
    parser.add_argument("--sample", type=int, help="questions per set (seed 13); a smaller set is asked in full")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a strata setting")
    args = parser.parse_args()
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if unknown := [s for s in systems if s not in SYSTEMS]:
        parser.error(f"unknown --systems {unknown}; choose from {', '.join(SYSTEMS)}")
    quiet_logging()
    logging.getLogger("strata").setLevel(logging.WARNING)
    overrides = parse_overrides(args.set)
    tables = []
    for dataset in args.datasets:
        print(f"{dataset}:", file=sys.stderr)
        tables.append(bench_set(dataset, args.out / dataset.stem, args.sample, systems, overrides))
    print(machine())
    if overrides:
        print(f"strata settings changed: {overrides}")
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
