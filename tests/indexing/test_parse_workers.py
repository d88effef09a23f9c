"""The pool of parse workers: a worker parses file after file, and a crash, a timeout, a memory cap or a stop
ends only that worker and fails only the file it held.

The probes (``tests/support/parse_probes.py``) write the worker's pid to a file and hang: the test waits for
the file, so it acts on a worker that is parsing, then kills it, or lets the timeout or the stop do it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from strata.errors import IndexingStoppedError, LoaderError
from strata.indexing.loaders import LoaderLimits, load_document
from strata.indexing.loaders._isolated import parse_isolated
from strata.indexing.loaders._worker import NICENESS
from tests.support import parse_probes
from tests.support.processes import wait_for

pytestmark = pytest.mark.integration  # worker processes of their own

LIMITS = LoaderLimits(parse_timeout_s=120)


def _pid_of_worker() -> int:
    return int(parse_isolated(parse_probes.whoami, b"", LIMITS).text)


def _announced(path: Path) -> int:
    assert wait_for(path.exists, within_s=120), "the probe never started parsing"
    return int(path.read_text())


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return any(line.split() == ["State:", "Z", "(zombie)"] for line in status)
    except FileNotFoundError:
        return True


def _in_thread(call: Callable[[], object]) -> Future[object]:
    executor = ThreadPoolExecutor(1)
    future = executor.submit(call)
    executor.shutdown(wait=False)
    return future


def test_a_worker_parses_file_after_file(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\nalpha\n", encoding="utf-8")

    first = _pid_of_worker()
    assert load_document(tmp_path / "a.md").text == "# A\n\nalpha"

    assert _pid_of_worker() == first
    assert first != os.getpid()


def test_a_worker_yields_the_cpu_to_the_process_it_parses_for() -> None:
    parent = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert os.getpriority(os.PRIO_PROCESS, _pid_of_worker()) == min(parent + NICENESS, 19)  # 19: the nicest


def test_a_worker_killed_mid_file_fails_only_that_file(tmp_path: Path) -> None:
    started = tmp_path / "started"
    (tmp_path / "next.md").write_text("# Next\n\nparsed after the crash\n", encoding="utf-8")
    parsing = _in_thread(lambda: parse_isolated(parse_probes.announce_and_hang, str(started).encode(), LIMITS))
    pid = _announced(started)

    os.kill(pid, signal.SIGKILL)

    with pytest.raises(LoaderError, match=r"^the parser process died \(killed by SIGKILL\) before it answered$"):
        parsing.result(timeout=120)
    assert load_document(tmp_path / "next.md").text == "# Next\n\nparsed after the crash"
    assert _pid_of_worker() != pid


def test_a_parse_past_its_time_kills_and_replaces_the_worker(tmp_path: Path) -> None:
    started = tmp_path / "started"

    with pytest.raises(
        LoaderError, match=r"^parsing took longer than STRATA_INDEXING__PARSE_TIMEOUT_S \(1 s\) and was stopped$"
    ):
        parse_isolated(parse_probes.announce_and_hang, str(started).encode(), LoaderLimits(parse_timeout_s=1))

    hung = int(started.read_text())
    assert _gone(hung)
    assert _pid_of_worker() != hung


def test_a_parse_past_its_memory_fails_and_the_worker_is_replaced(tmp_path: Path) -> None:
    started = tmp_path / "started"
    limits = LoaderLimits(parse_max_memory_bytes=64 * 1024 * 1024, parse_timeout_s=120)

    with pytest.raises(
        LoaderError,
        match=r"^parsing needed more memory than STRATA_INDEXING__PARSE_MAX_MEMORY_BYTES \(67,108,864 bytes\)$",
    ):
        parse_isolated(parse_probes.announce_and_grow, str(started).encode(), limits)

    grown = int(started.read_text())
    assert wait_for(lambda: _gone(grown), within_s=30), "a worker that ran out of memory is not used again"
    assert _pid_of_worker() != grown


def test_a_parse_that_fills_its_memory_then_recurses_in_c_fails_with_the_memory_setting() -> None:
    """The stack a parse recurses on is mapped before the cap: growing it with the address space full would
    kill the worker with SIGSEGV, and the file would fail without naming the setting."""
    limits = LoaderLimits(parse_timeout_s=120, parse_max_memory_bytes=64 * 1024 * 1024)
    with pytest.raises(LoaderError, match=r"^parsing needed more memory than STRATA_INDEXING__PARSE_MAX_MEMORY_BYTES"):
        parse_isolated(parse_probes.fill_then_recurse, b"", limits)
    assert _pid_of_worker() > 0  # the pool parses on


def test_a_worker_that_dies_at_its_memory_cap_names_the_memory_setting() -> None:
    """A parser can die at the cap instead of raising MemoryError (CPython's fatal "Cannot recover from
    MemoryErrors" is a SIGABRT): the failure names the setting to raise; a kill from outside does not."""
    limits = LoaderLimits(parse_timeout_s=120, parse_max_memory_bytes=64 * 1024 * 1024)
    with pytest.raises(LoaderError) as at_cap:
        parse_isolated(parse_probes.fill_then_abort, b"", limits)
    assert str(at_cap.value) == (
        "the parser process died (killed by SIGABRT) before it answered; "
        "at STRATA_INDEXING__PARSE_MAX_MEMORY_BYTES (67,108,864 bytes) a parse can end so"
    )
    assert _pid_of_worker() > 0  # the pool parses on


def test_a_stop_while_parsing_kills_the_worker(tmp_path: Path) -> None:
    started, stop = tmp_path / "started", threading.Event()
    parsing = _in_thread(lambda: parse_isolated(parse_probes.announce_and_hang, str(started).encode(), LIMITS, stop))
    pid = _announced(started)

    stop.set()

    with pytest.raises(IndexingStoppedError, match="shutting down"):
        parsing.result(timeout=120)
    assert _gone(pid)


def test_two_callers_parse_in_two_workers_at_once(tmp_path: Path) -> None:
    marks = [tmp_path / "first", tmp_path / "second"]
    limits = LoaderLimits(parse_timeout_s=120, parse_workers=2)
    parsing = [
        _in_thread(lambda mark=mark: parse_isolated(parse_probes.announce_and_hang, str(mark).encode(), limits))
        for mark in marks
    ]

    pids = [_announced(mark) for mark in marks]  # both hang at once: two workers

    assert len(set(pids)) == 2
    for pid, future in zip(pids, parsing, strict=True):
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(LoaderError, match="killed by SIGKILL"):
            future.result(timeout=120)


def test_a_worker_ends_when_its_parent_dies(tmp_path: Path) -> None:
    started = tmp_path / "started"
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from strata.indexing.loaders._isolated import parse_isolated; "
            "from strata.indexing.loaders import LoaderLimits; from tests.support import parse_probes; "
            "parse_isolated(parse_probes.announce_and_hang, sys.argv[1].encode(), LoaderLimits(parse_timeout_s=300))",
            str(started),
        ],
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        worker = _announced(started)
        parent.kill()
        parent.wait(30)

        assert wait_for(lambda: _gone(worker), within_s=30), "an orphaned worker kept parsing"
    finally:
        parent.kill()
        parent.wait(30)
