"""The flat hybrid baseline beside ``strata eval``: what a hand-rolled Milvus script gets.

Milvus's own ``hybrid_search`` over the kb's dense and BM25 routes (``RRFRanker(60)``, each route limited to
``--route-limit`` leaves, ``_bench.native_hybrid_search``), the leaves returned as they are: no merge, no rerank,
no strata retrieval code. It reads the index a ``strata eval --out OUT`` run built and scores the same questions
(``--sample``, seed 13) with ``strata.evaluation.metrics``, so its row stands next to ``strata eval``'s::

    strata eval DATA --modes hybrid,hybrid+merge --out OUT [--sample N]
    python scripts/bench_flat_baseline.py DATA --out OUT [--sample N]

Query vectors are computed first, so its latency columns leave out query encoding (strata's rows include it).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from _bench import machine, native_hybrid_search, quiet_logging
from strata.config import load_settings
from strata.encoders import tune_openmp
from strata.evaluation.metrics import Item, QueryOutcome, markdown_table, summarize
from strata.evaluation.runner import eval_settings, sampled_queries
from strata.resources import Resources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", type=Path, help="the SQuAD-style file `strata eval` read")
    parser.add_argument("--out", type=Path, required=True, help="the `strata eval --out` folder (its index/)")
    parser.add_argument("--kb", default="eval")
    parser.add_argument("--sample", type=int, help="questions to sample (seed 13), as `strata eval --sample`")
    parser.add_argument("--route-limit", type=int, default=20)
    args = parser.parse_args()
    tune_openmp()
    quiet_logging()
    index_dir = args.out / "index"
    if not (index_dir / "milvus.db").exists():
        parser.error(f"{index_dir} holds no index: run `strata eval {args.dataset} --out {args.out}` first")
    resources = Resources(eval_settings(load_settings(), index_dir))
    try:
        queries, total = sampled_queries(args.dataset, args.sample)
        vectors = resources.encoder.encode_queries([q.question for q in queries])
        index = resources.leaf_index

        def search(vector: object, question: str, k: int) -> tuple[tuple[Item, ...], float]:
            started = time.perf_counter()
            hits = native_hybrid_search(
                index,
                vector,
                question,
                limit=k,
                route_limit=args.route_limit,
                kb=args.kb,  # type: ignore[arg-type]
            )
            items = tuple(Item(text=h.chunk.text, doc_id=str(h.chunk.metadata["doc_id"])) for h in hits)
            return items, (time.perf_counter() - started) * 1000

        for query, vector in list(zip(queries, vectors))[:5]:
            search(vector, query.question, 10)  # warm-up
        outcomes = []
        for query, vector in zip(queries, vectors):
            (at_5, ms_5), (at_10, ms_10) = search(vector, query.question, 5), search(vector, query.question, 10)
            outcomes.append(QueryOutcome(query.query_id, query.doc_id, query.answers, at_5, at_10, ms_5, ms_10))
        print(machine())
        print(f"{len(queries)} of {total} questions; latency without query encoding")
        print(markdown_table({f"flat hybrid (hybrid_search, RRF 60, routes {args.route_limit})": summarize(outcomes)}))
    finally:
        resources.close()


if __name__ == "__main__":
    main()
