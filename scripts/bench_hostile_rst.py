"""Hostile reStructuredText uploads against ``strata serve --workers 2``: what they cost and what another tenant sees.

Two parts, printed in turn:

1. Parse CPU of issue #50's page (``.. _tN:`` targets, then a ``\\`tN\\`_`` reference to each) at 50, 100, 200
   and 400 KB, parsed in this process (``time.process_time``; before the linear ``PropagateTargets``:
   1.6 / 4.5 / 10.7 / 53.9 s).
2. The service as teams share it (``tests/api/shared_service.py``: a Milvus server, a fresh PostgreSQL database,
   the shared Redis, two tenants' kbs, two workers). Tenant B's uncached ``/retrieve`` (a new query each time,
   on a fresh connection, one after another) is timed idle, then while tenant A's write key runs
   ``--uploaders`` uploaders, each sending the 400 KB page again as soon as its last upload is answered
   (refusals included: 429 over the key's share). Prints p50/p95/max of both phases, the ratio of the p95s,
   the uploads' outcomes and the load.

    PYTHONPATH=. STRATA_TEST_MILVUS_URI=http://127.0.0.1:19531 python scripts/bench_hostile_rst.py [--uploaders 8] [--queries 60]
        [--setting api__max_uploads 1]
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from tests.api.shared_service import TENANT_A_WRITE, TENANT_B_READ, SharedService, auth, shared_service
from tests.support.stores import fresh_pg_database

from _bench import machine, p
from strata.indexing.loaders import LoaderLimits
from strata.indexing.loaders._rst import parse_rst

KB = 1024


def hostile_page(size: int) -> bytes:
    """Issue #50's page: named targets, then a reference to each, about ``size`` bytes."""
    targets, total = [], 0
    while total < size // 2:
        targets.append(f".. _t{len(targets)}:\n")
        total += len(targets[-1])
    references = "".join(f"`t{n}`_\n" for n in range(len(targets)))
    return ("".join(targets) + "\n" + references).encode()


def parse_cpu(sizes: list[int]) -> None:
    limits = LoaderLimits(max_elements=10_000_000)
    for size in sizes:
        raw = hostile_page(size)
        gc.collect()
        started = time.process_time()
        parse_rst(raw, limits)
        print(f"  parse {len(raw) // KB:4d} KB: {time.process_time() - started:6.2f} s CPU", flush=True)


def retrieve_ms(service: SharedService, count: int, tag: str) -> list[float]:
    times = []
    for n in range(count):
        query = f"when is the sourdough starter fed {tag} {n} {time.time_ns()}?"  # never in the query cache
        started = time.perf_counter()
        answer = httpx.post(
            f"{service.url}/retrieve",
            json={"query": query, "top_k": 3, "kb_ids": ["beta"]},
            headers=auth(TENANT_B_READ),
            timeout=120,
        )
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, answer.text
    return times


def uploader(service: SharedService, page: bytes, stop: threading.Event, outcomes: Counter[int]) -> None:
    while not stop.is_set():
        try:
            answer = httpx.post(
                f"{service.url}/kbs/alpha/documents",
                files={"files": ("targets.rst", page, "text/x-rst")},
                headers=auth(TENANT_A_WRITE),
                timeout=300,
            )
            outcomes[answer.status_code] += 1
            if answer.status_code != 200:
                stop.wait(float(answer.headers.get("retry-after", "1")))  # as a client honouring Retry-After
        except httpx.HTTPError:
            outcomes[0] += 1


def show(name: str, times: list[float]) -> None:
    print(f"  {name}: n={len(times)} p50 {p(times, 50):.0f} ms, p95 {p(times, 95):.0f} ms, max {max(times):.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploaders", type=int, default=8)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--size-kb", type=int, default=400)
    parser.add_argument(
        "--setting",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "VALUE"),
        help="a setting of the service, e.g. --setting api__max_uploads 1 (STRATA_API__MAX_UPLOADS=1)",
    )
    args = parser.parse_args()
    milvus = os.environ.get("STRATA_TEST_MILVUS_URI")
    if not milvus:
        parser.error("set STRATA_TEST_MILVUS_URI to a Milvus server (a milvus-lite server will do)")
    print(machine())
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
    parse_cpu([50 * KB, 100 * KB, 200 * KB, 400 * KB])
    page = hostile_page(args.size_kb * KB)
    settings = {f"STRATA_{name.upper()}": value for name, value in args.setting}
    with (
        tempfile.TemporaryDirectory() as root,
        fresh_pg_database() as pg_url,
        shared_service(Path(root), milvus, pg_url, workers=2, **settings) as service,
    ):
        retrieve_ms(service, 5, "warm")
        idle = retrieve_ms(service, args.queries, "idle")
        stop, outcomes = threading.Event(), Counter[int]()
        threads = [
            threading.Thread(target=uploader, args=(service, page, stop, outcomes), daemon=True)
            for _ in range(args.uploaders)
        ]
        for thread in threads:
            thread.start()
        try:
            attacked = retrieve_ms(service, args.queries, "attacked")
        finally:
            stop.set()
            for thread in threads:
                thread.join(300)
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    show("tenant B /retrieve, idle", idle)
    show(f"tenant B /retrieve, {args.uploaders} hostile uploaders of tenant A", attacked)
    print(f"  p95 ratio attacked/idle: {p(attacked, 95) / p(idle, 95):.2f}")
    print(f"  tenant A's uploads by status: {dict(sorted(outcomes.items()))}")


if __name__ == "__main__":
    main()
