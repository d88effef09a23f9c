"""How long counting and checking a large kb's leaves takes on a Milvus server: ``count``, ``present`` (the
consistency probe of ``strata stats``) and ``leaf_ids`` (what ``strata reconcile`` reads).

Writes ``--leaves`` synthetic leaves (random unit vectors, short texts) of one kb into a collection of its own
on ``--uri`` (default: a ``milvus-lite server`` started here in a temporary folder), flushes, then times each
call. No encoder and no SQL: the figures are Milvus's alone.

    python scripts/bench_counts.py --leaves 250000
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from strata.cli.milvus_server import server_command
from strata.config import MilvusSettings
from strata.indexing.chunking import chunk_id
from strata.stores.milvus_collection import LeafCollection as LeafIndex
from strata.types import Chunk

DIM = 384
DOCS = 100


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def milvus_server(uri: str | None) -> Iterator[str]:
    if uri:
        yield uri
        return
    folder = Path(tempfile.mkdtemp(prefix="bench-counts-"))
    port = free_port()
    process = subprocess.Popen(
        server_command(folder, host="127.0.0.1", port=port),  # what `strata milvus-server` runs
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


def open_index(uri: str, collection: str) -> LeafIndex:
    deadline = time.monotonic() + 60
    while True:
        try:
            return LeafIndex(
                MilvusSettings(uri=uri, collection=collection, timeout_s=600), encoder_name="bench", dim=DIM
            )
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the server is starting


def leaves(kb: str, n: int, start: int) -> list[Chunk]:
    out = []
    for i in range(start, start + n):
        doc, ordinal = f"doc-{i % DOCS}", i // DOCS
        text = f"leaf {i} of {doc}: the tide rose {i % 7} metres and the lamp used {i % 50} litres"
        out.append(
            Chunk(
                chunk_id=chunk_id(kb, doc, 1, 3, ordinal),
                kb_id=kb,
                doc_id=doc,
                version=1,
                level=3,
                parent_id=None,
                root_id="r",
                ordinal=ordinal,
                text=text,
                heading_path="",
                char_start=0,
                char_end=len(text),
            )
        )
    return out


def timed(label: str, call) -> object:
    started = time.perf_counter()
    value = call()
    print(
        f"{label:<44} {time.perf_counter() - started:8.2f} s   -> "
        f"{value if not isinstance(value, (dict, set)) else len(value)}"
    )
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=250_000)
    parser.add_argument("--uri", help="a Milvus server (default: a milvus-lite server started here)")
    args = parser.parse_args()
    kb = "bench"
    with milvus_server(args.uri) as uri:
        index = open_index(uri, f"bench_counts_{uuid.uuid4().hex[:8]}")
        rng = np.random.default_rng(0)
        started = time.perf_counter()
        for start in range(0, args.leaves, 5000):
            batch = leaves(kb, min(5000, args.leaves - start), start)
            vectors = rng.standard_normal((len(batch), DIM)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            index.writes.upsert(batch, vectors, [c.text for c in batch])
        index.writes.flush()
        print(
            f"wrote {args.leaves} leaves in {time.perf_counter() - started:.1f} s on {uri} (load "
            f"{os.getloadavg()[0]:.2f})"
        )
        timed("count(kb)", lambda: index.reads.count(kb))
        probe = [chunk_id(kb, f"doc-{d}", 1, 3, o) for d in range(DOCS) for o in (0, args.leaves // DOCS - 1)]
        timed(f"present({len(probe)} probe ids)", lambda: index.reads.present(kb, probe))
        timed("leaf_ids(kb)", lambda: index.reads.leaf_ids(kb))
        index.writes.drop_collection()
        index.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
