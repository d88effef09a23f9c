"""Per-file cost of parsing in isolation: small Markdown files through ``load_document`` against in place.

Writes ``--files`` small Markdown files (front matter, three headings, about 2 KB each), then times, per file:

- in place: the file's bytes parsed by the Markdown loader in this process (no isolation at all);
- isolated: ``load_document`` on each file, one after another (the parse in a separate process, as in
  ``strata index`` and the service), and with ``--threads`` callers at once (files per second of wall time).

The first isolated parse starts the parse process (or the pool's first worker) and is left out; the
overhead is the isolated figure minus the in-place one::

    .venv/bin/python scripts/bench_parse.py
    .venv/bin/python scripts/bench_parse.py --files 1000 --threads 1 2 4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from _bench import machine
from strata.indexing.loaders import LoaderLimits, load_document
from strata.indexing.loaders._markdown import parse_markdown

LIMITS = LoaderLimits()


def write_files(folder: Path, count: int) -> list[Path]:
    paths = []
    for i in range(count):
        sections = "".join(
            f"\n## Part {j}\n\nFile {i} part {j} keeps record {i * 7 + j} for {j + 1} days. " + "Some text here. " * 40
            for j in range(3)
        )
        path = folder / f"note-{i:05d}.md"
        path.write_text(f"---\ntitle: Note {i}\nmodule: m{i % 7}\n---\n# Note {i}\n{sections}", encoding="utf-8")
        paths.append(path)
    return paths


def in_place_ms(paths: Sequence[Path]) -> float:
    started = time.perf_counter()
    for path in paths:
        parse_markdown(path.read_bytes(), LIMITS)
    return (time.perf_counter() - started) * 1000 / len(paths)


def isolated_ms(paths: Sequence[Path], threads: int) -> float:
    """Wall milliseconds per file of ``load_document`` over ``paths`` from ``threads`` callers at once."""
    started = time.perf_counter()
    if threads == 1:
        for path in paths:
            load_document(path, limits=LIMITS)
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda path: load_document(path, limits=LIMITS), paths))
    return (time.perf_counter() - started) * 1000 / len(paths)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="callers at once (one run each)")
    args = parser.parse_args(argv)
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="bench-parse-") as folder:
        paths = write_files(Path(folder), args.files)
        size = statistics.mean(p.stat().st_size for p in paths)
        started = time.perf_counter()
        load_document(paths[0], limits=LIMITS)
        first_ms = (time.perf_counter() - started) * 1000
        place = in_place_ms(paths)
        isolated = {threads: isolated_ms(paths, threads) for threads in args.threads}
    loads.append(os.getloadavg()[0])
    print(f"machine: {machine()}")
    print(f"data: {args.files} Markdown files, {size:,.0f} bytes on average")
    print(f"first isolated parse (starts the parse process): {first_ms:.0f} ms")
    print(f"in place: {place:.2f} ms per file")
    for threads, ms in isolated.items():
        print(
            f"isolated, {threads} caller(s): {ms:.2f} ms per file ({1000 / ms:.0f} files/s), "
            f"overhead over in place {ms - place:.2f} ms"
        )
    print("1-min load average at the start and the end: " + " / ".join(f"{x:.2f}" for x in loads))


if __name__ == "__main__":
    main()
