"""Where the test suite's minutes go: each test's wall time and CPU time, its own and its finished subprocesses'.

    SUITE_CPU_DIR=/tmp/cpu PYTHONPATH=scripts pytest -q -rs -p suite_cpu   # records (every xdist worker)
    python scripts/suite_cpu.py /tmp/cpu                                           # sums per module

A subprocess's CPU is counted when it is waited for (``RUSAGE_CHILDREN``), so a process a module fixture starts
counts in the test that ends it; a shared server's (the session's Milvus server) is not counted.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


_records: dict[str, Any] = {}


def pytest_configure(config: pytest.Config) -> None:
    """Opens this process's record file once, before any test (the tests may clear ``STRATA_*`` variables)."""
    folder = Path(os.environ.get("SUITE_CPU_DIR", "suite-cpu"))
    folder.mkdir(parents=True, exist_ok=True)
    _records["out"] = (folder / f"{os.getpid()}.jsonl").open("a", encoding="utf-8")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    own, children = _cpu()
    started = time.perf_counter()
    yield
    own_after, children_after = _cpu()
    record = {
        "test": item.nodeid,
        "wall": time.perf_counter() - started,
        "own": own_after - own,
        "children": children_after - children,
    }
    _records["out"].write(json.dumps(record) + "\n")
    _records["out"].flush()


def summary(folder: Path, top: int = 20) -> str:
    rows: list[dict[str, Any]] = [json.loads(line) for f in folder.glob("*.jsonl") for line in f.open()]
    per_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for row in rows:
        sums = per_module[row["test"].split("::")[0]]
        for i, key in enumerate(("wall", "own", "children")):
            sums[i] += row[key]
    total = [sum(row[key] for row in rows) for key in ("wall", "own", "children")]
    lines = [f"{len(rows)} tests: {total[0]:.0f} worker-s, CPU {total[1]:.0f} s own + {total[2]:.0f} s subprocesses"]
    lines.append(f"{'wall s':>8} {'own s':>7} {'subproc s':>9}  module")
    for module, (wall, own, children) in sorted(per_module.items(), key=lambda kv: -kv[1][0])[:top]:
        lines.append(f"{wall:8.1f} {own:7.1f} {children:9.1f}  {module}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1] if len(sys.argv) > 1 else "suite-cpu")))
