"""``strata eval``: the evaluation of docs/evaluation.md, over retrieval modes (``strata.evaluation.modes``)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from strata.cli.progress import make_progress
from strata.config import ConfigError, Settings
from strata.evaluation import report as out
from strata.evaluation.modes import parse_modes
from strata.evaluation.runner import (
    build_index,
    describe_machine,
    eval_settings,
    index_summary,
    query_embed_ms_p50,
    run_mode,
    sampled_queries,
    summarize_modes,
)

if TYPE_CHECKING:
    from strata.evaluation.dataset import Query
    from strata.evaluation.runner import ModeResult
    from strata.resources import Resources

logger = logging.getLogger("strata.eval")


def _parse(args: argparse.Namespace) -> tuple[list[int], list[str]]:
    ks = sorted({int(k) for k in args.k.split(",") if k.strip()})
    if ks != [5, 10]:
        raise ConfigError("--k must be 5,10: docs/evaluation.md's metrics are defined on the k=5 and k=10 lists")
    return ks, parse_modes(args.modes)


def cmd_eval(args: argparse.Namespace, settings: Settings) -> int:
    ks, modes = _parse(args)
    args.out.mkdir(parents=True, exist_ok=True)
    settings = eval_settings(settings, args.out / "index")
    queries, total = sampled_queries(args.dataset, args.sample)
    print(f"eval: {len(queries)} of {total} questions from {args.dataset}; modes {', '.join(modes)}", file=sys.stderr)
    progress = make_progress()
    try:
        resources, index_report, n_articles = build_index(settings, args.dataset, args.out, args.kb, progress)
    finally:
        progress.close()
    embed_p50 = query_embed_ms_p50(resources, queries)
    results = [_run_mode(resources, mode, queries, ks, args.kb) for mode in modes]
    reports = summarize_modes(results)
    with_reference = args.dataset.name == "cmrc2018_dev.json"
    print(out.markdown_report(reports, with_reference=with_reference))
    index_info = index_summary(resources, index_report, args.kb)
    _print_notes(results, index_info, embed_p50, len(queries))
    meta = {
        "dataset": str(args.dataset),
        "articles": n_articles,
        "questions_total": total,
        "sample": args.sample,
        "seed": 13,
        "n_queries": len(queries),
        "ks": ks,
        "encoder": resources.encoder.name,
        "settings": settings.model_dump(
            mode="json",
            exclude={"rerank": {"api_key"}, "embedding": {"api_key"}, "milvus": {"token"}, "api": {"api_key", "keys"}},
        ),
        "index": index_info,
        "query_embed_ms_p50": round(embed_p50, 2),
        "latency_includes_query_encoding": True,
        "machine": describe_machine(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path = out.write_results(args.out, out.results_payload(meta=meta, results=results, reports=reports))
    chart = out.write_chart(args.out, results, reports) if reports else None
    print(f"\nresults: {path}" + (f"\nchart: {chart}" if chart else ""))
    return 0


def _run_mode(resources: Resources, mode: str, queries: Sequence[Query], ks: Sequence[int], kb: str) -> ModeResult:
    from tqdm import tqdm

    with tqdm(total=len(queries), desc=mode, unit="q", disable=not sys.stderr.isatty()) as bar:

        def on_query() -> None:
            bar.update(1)

        result = run_mode(resources, mode, queries, ks, kb, on_query=on_query)
    if not sys.stderr.isatty():
        logger.info("mode %s: %d queries done %s", mode, len(result.outcomes), result.statuses)
    return result


def _print_notes(results: Sequence[ModeResult], index: dict, embed_p50: float, n: int) -> None:
    print(
        f"\nn = {n} questions. Latency is the wall time of retrieve_documents including query encoding "
        f"(query_embed_ms_p50 = {embed_p50:.1f} ms); the docs/evaluation.md §8 reference latency excludes encoding."
    )
    if n != out.SPEC_REFERENCE_QUESTIONS:
        print(
            "The docs/evaluation.md §8 reference rows were measured on its "
            f"{out.SPEC_REFERENCE_QUESTIONS:,}-question subsample (seed 13): compare like with like using "
            f"--sample {out.SPEC_REFERENCE_QUESTIONS}."
        )
    levels = index["chunks_by_level"]
    print(
        f"index: {index['leaves_in_index']} leaves in Milvus; "
        f"chunks L1 {levels['1']}, L2 {levels['2']}, L3 {levels['3']}"
    )
    if index["reused"]:
        print("index reused: every document was unchanged since the last run (no indexing time to report)")
    else:
        print(
            f"this run indexed {index['chunks_written']} chunks in {index['seconds']:.1f} s "
            f"({index['chunks_per_s']:.1f} chunks/s; {index['passages_encoded']} passages encoded, "
            f"{index['embeddings_reused']} from the embedding cache)"
        )
    for result in results:
        if result.skipped:
            print(f"mode {result.mode}: skipped ({result.skipped})")
        elif set(result.statuses) - {"ok"}:
            print(f"mode {result.mode}: statuses {result.statuses}; e.g. {result.errors[:3]}")
