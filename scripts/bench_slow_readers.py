"""Slow readers against ``strata serve --workers 2``: what the workers hold and how ``/health`` answers meanwhile.

Starts the service as teams share it (``tests/api/shared_service.py``: a Milvus server, a fresh PostgreSQL
database, the shared Redis, two tenants' kbs), then runs issue #50's attack (``tests/api/slow_readers.py``):
``--sockets`` sockets with a 1 KiB receive buffer each pipeline eight ``GET /openapi.json`` and never read, opened
one after another and held ``--hold-s`` more, while ``/health`` and tenant B's ``/retrieve`` are asked on fresh
connections (every 0.25 s and 1 s). Prints each worker's descriptors and RSS (idle, peak), the probes' latency
and failures, and the load before and after.

    STRATA_TEST_MILVUS_URI=http://127.0.0.1:19531 python scripts/bench_slow_readers.py [--sockets 10000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.api.shared_service import shared_service  # noqa: E402
from tests.api.slow_readers import BURST, HOLD, AttackReport, attack, open_files  # noqa: E402
from tests.support.stores import fresh_pg_database  # noqa: E402

from _bench import machine, p  # noqa: E402
from strata.api.connections import ACCEPT_PASSES, BACKLOG, FD_RESERVE  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sockets", type=int, default=10_000)
    parser.add_argument("--hold-s", type=float, default=10.0)
    parser.add_argument("--max-connections", type=int, default=1000, help="STRATA_API__MAX_CONNECTIONS per worker")
    args = parser.parse_args()
    milvus = os.environ.get("STRATA_TEST_MILVUS_URI")
    if not milvus:
        parser.error("set STRATA_TEST_MILVUS_URI to a Milvus server (a milvus-lite server will do)")
    print(machine())
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
    with (
        tempfile.TemporaryDirectory() as root,
        fresh_pg_database() as pg_url,
        shared_service(Path(root), milvus, pg_url, STRATA_API__MAX_CONNECTIONS=str(args.max_connections)) as service,
        open_files(args.sockets + 1_000),
    ):
        service.http.close()
        report = attack(service, sockets=args.sockets, hold_s=args.hold_s)
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    show(report, args.max_connections)


def show(report: AttackReport, cap: int) -> None:
    budget = cap + FD_RESERVE + ACCEPT_PASSES * BACKLOG
    print(f"{report.sockets} slow readers, {report.connect_failures} connects failed; cap {cap} per worker")
    for pid in report.peak_fds:
        print(
            f"  worker {pid}: descriptors {report.idle_fds[pid]} idle, {report.peak_fds[pid]} peak "
            f"(budget {budget}); RSS {report.idle_rss_mb[pid]:.0f} MB idle, {report.peak_rss_mb[pid]:.0f} MB peak"
        )
    for name, probe in (("/health", report.health), ("/retrieve (tenant B)", report.retrieve)):
        for phase in (BURST, HOLD):
            print(f"  {name} {phase}: {latencies(probe.answered_ms[phase], probe.failures[phase])}")


def latencies(ms: list[float], failures: list[str]) -> str:
    answered = f"{len(ms)} answered 200"
    if ms:
        answered += f", p50 {p(ms, 50):.0f} ms, p95 {p(ms, 95):.0f} ms, max {max(ms):.0f} ms"
    return f"{answered}; {len(failures)} failed {sorted(set(failures))}"


if __name__ == "__main__":
    main()
