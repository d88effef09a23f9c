"""Parse and chunk time of the worst input of each pattern family, at growing sizes: linear growth or not.

Each input of ``tests/pathological_text.py`` (runs of spaces, dots, heading marks, an unclosed front matter,
HTML comments ...) and a normal document are written at each size, loaded by ``load_document`` (the parse
runs in its child process, as in the service) and chunked with the default settings::

    .venv/bin/python scripts/bench_text_linearity.py
    .venv/bin/python scripts/bench_text_linearity.py --mb 0.25 1 4 --only dots spaces --repeat 3

Prints a line per input: parse and chunk milliseconds per size, and the ratio of each total to the previous
size's. Linear growth shows as ratios near the size ratio (4 for 0.25 -> 1 -> 4 MB); a quadratic pattern
shows 16. The element limit is raised so that every input reaches the chunker. Then the cost of the child
process per small file: the same 3 KB files parsed through ``parse_isolated`` and in place.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.pathological_text import NORMAL, PATHOLOGIES, Pathology  # noqa: E402

from strata.config import ChunkingSettings  # noqa: E402
from strata.errors import LoaderError  # noqa: E402
from strata.indexing.chunking import chunk_document  # noqa: E402
from strata.indexing.loaders import LoaderLimits, load_document  # noqa: E402
from strata.indexing.loaders._html import parse_html  # noqa: E402
from strata.indexing.loaders._isolated import Parse, parse_isolated  # noqa: E402
from strata.indexing.loaders._markdown import parse_markdown  # noqa: E402

MB = 1024 * 1024
LIMITS = LoaderLimits(max_elements=100_000_000)


def measure(case: Pathology, size: int, folder: Path) -> tuple[float, float, str]:
    """(parse ms, chunk ms, what came out) of ``case`` at ``size`` bytes."""
    path = folder / case.filename
    path.write_bytes(case.build(size))
    started = time.perf_counter()
    try:
        doc = load_document(path, limits=LIMITS)
    except LoaderError as exc:
        return (time.perf_counter() - started) * 1000, 0.0, f"refused: {exc}"
    parsed = time.perf_counter()
    chunks = chunk_document(doc, kb_id="bench", version=1, settings=ChunkingSettings())
    done = time.perf_counter()
    return (parsed - started) * 1000, (done - parsed) * 1000, f"{len(chunks)} chunks"


def report_case(case: Pathology, sizes: Sequence[float], folder: Path, repeat: int) -> None:
    cells, totals, outcome = [], [], ""
    for mb in sizes:
        # the fastest of `repeat` runs: on a shared machine the others measure the neighbours
        runs = [measure(case, int(mb * MB), folder) for _ in range(repeat)]
        parse_ms, chunk_ms, outcome = min(runs, key=lambda run: run[0] + run[1])
        ratio = f" x{(parse_ms + chunk_ms) / totals[-1]:.1f}" if totals else ""
        totals.append(parse_ms + chunk_ms)
        cells.append(f"{parse_ms:7.0f} + {chunk_ms:6.0f} ms{ratio:6}")
    print(f"{case.name:24} | " + " | ".join(cells) + f" | {outcome}", flush=True)


def child_cost(rounds: int = 30) -> None:
    """Milliseconds per 3 KB file parsed in a child process and in place (median of ``rounds``)."""
    markdown = ("---\ntitle: T\n---\n# Title\n\n" + "Some text here. " * 180).encode()
    html = ("<html><title>T</title><body><h1>H</h1>" + "<p>Some text here.</p>" * 120 + "</body></html>").encode()
    files: list[tuple[str, Parse, bytes]] = [("markdown", parse_markdown, markdown), ("html", parse_html, html)]
    for name, parse, raw in files:
        parse_isolated(parse, raw, LIMITS)  # the forkserver starts once per process
        isolated = statistics.median(_timed(lambda: parse_isolated(parse, raw, LIMITS)) for _ in range(rounds))
        in_place = statistics.median(_timed(lambda: parse(raw, LIMITS)) for _ in range(rounds))
        print(f"{name} {len(raw):,} bytes: child process {isolated:.1f} ms, in place {in_place:.2f} ms per file")


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[0.25, 1, 4], help="sizes in MB")
    parser.add_argument("--only", nargs="*", help="names of the inputs to run (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per input and size; the fastest is shown")
    args = parser.parse_args(argv)
    cases = [c for c in (*PATHOLOGIES, NORMAL) if not args.only or c.name in args.only]
    print(f"{'input':24} | " + " | ".join(f"{f'{mb:g} MB: parse + chunk':>28}" for mb in args.mb) + " | last size")
    with tempfile.TemporaryDirectory(prefix="bench-linearity-") as folder:
        for case in cases:
            report_case(case, args.mb, Path(folder), args.repeat)
    child_cost()


if __name__ == "__main__":  # each parse's child process runs this module again: nothing may run on import
    main()
