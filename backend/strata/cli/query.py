"""``strata query``: evidence for a query, as text, JSON or an explanation."""

from __future__ import annotations

import argparse
import json
from typing import Any

from strata.config import Settings
from strata.rag import format_for_tool_output
from strata.rag.retrieve import default_engine
from strata.types import Filters, RetrievalResult


def cmd_query(args: argparse.Namespace, settings: Settings) -> int:
    filters = Filters(
        modules=tuple(args.module), skill_points=tuple(args.skill_point), source_prefix=args.source_prefix
    )
    result = default_engine(settings).retrieve(
        args.query,
        args.top_k,
        kb_ids=args.kb,
        filters=None if filters.is_empty() else filters,
        strategy=args.strategy,
        queries=args.query_variant or None,
    )
    if args.json:
        print(json.dumps(result.to_dict(), ensure_ascii=False, indent=2))
    elif args.explain:
        print(explain(result))
    else:
        print(format_for_tool_output(result.docs, max_chunks=args.top_k))
        if result.meta.status != "ok":
            print(f"\n[{result.meta.status}: {', '.join(result.meta.degraded) or result.meta.mode}]")
    return 0 if result.meta.status != "failed" else 1


def explain(result: RetrievalResult) -> str:
    """A person's view of the meta record: stages, merges, rerank, and each doc's trace."""
    meta = result.meta
    lines = [
        f"query: {meta.query}",
        f"status {meta.status}, strategy {meta.strategy}, mode {meta.mode}, top_k {meta.top_k}, "
        f"candidate_k {meta.candidate_k}, cache {meta.cache}",
        *([f"query variants: {' | '.join(meta.query_variants)}"] if meta.query_variants else []),
        *([f"bm25 left out: {' '.join(meta.bm25_query['dropped'])}"] if meta.bm25_query.get("dropped") else []),
        f"candidates: dense {meta.dense_candidates}, bm25 {meta.sparse_candidates}, fused {meta.fused_candidates}",
        "",
        "stage            ms",
        *(f"{stage:<14}{ms:>8.1f}" for stage, ms in meta.timings_ms.items()),
        "",
    ]
    for r in meta.merge_rounds:
        lines.append(
            f"merge round {r.round}: {r.parents_merged} parents merged, {r.children_replaced} children replaced, "
            f"{r.parents_missing} parents missing"
        )
    lines.append(f"rerank: {meta.rerank.status} ({meta.rerank.reason})")
    lines.append(f"returned {meta.returned}, dropped by min score {meta.dropped_by_min_score}")
    lines += [f"error in {e.stage}: {e.error}: {e.message}" for e in meta.errors]
    lines += ["", _trace_table(result)]
    return "\n".join(lines)


def _trace_table(result: RetrievalResult) -> str:
    header = f"{'#':>2} {'L':>1} {'score':>8} {'stage':<7} {'dense':>11} {'bm25':>11} {'fused':>7}  source — heading"
    rows = [header]
    for n, doc in enumerate(result.docs, start=1):
        t: dict[str, Any] = doc.metadata.get("trace", {})
        rows.append(
            f"{n:>2} {doc.metadata.get('level', '?')} {doc.score:>8.4f} {t.get('score_stage', ''):<7} "
            f"{_route(t.get('dense_rank'), t.get('dense_score')):>11} "
            f"{_route(t.get('sparse_rank'), t.get('sparse_score')):>11} "
            f"{(t.get('fused_score') or 0):>7.4f}  "
            f"{doc.metadata.get('source', '')} — {doc.metadata.get('heading_path', '')}"
        )
        if doc.metadata.get("merged_from"):
            rows.append(f"{'':>14}merged from {len(doc.metadata['merged_from'])} children")
    return "\n".join(rows)


def _route(rank: int | None, score: float | None) -> str:
    return "-" if rank is None else f"#{rank} {score:.3f}"
