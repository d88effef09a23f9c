"""Parsing in warm worker processes that can be killed: bounded in time and memory, and stoppable.

python-docx, pypdf, lxml and PyYAML run in C and Python loops that no check
inside strata can interrupt, and a parse in the service's own process holds
its interpreter lock: a slow one froze every request. So each parse, of every
format, runs in a worker process of a pool (``ParsePool``, one per process).
The caller waits for the answer at most ``parse_timeout_s``, then kills the
worker and fails the file; the worker caps its address space at its size plus
``parse_max_memory_bytes`` for the parse, so a parse that needs more fails with
``MemoryError`` (reported as such) instead of growing the service, and the
worker leaves after it. A text over ``max_document_bytes`` fails in the worker,
so the caller never receives it. A ``stop`` event set while the caller waits
(the service is shutting down) kills the worker and raises
``IndexingStoppedError``. A worker that dies (a crash in C, a kill from outside)
fails the file it was parsing and only that one: the next file gets a new
worker. At most ``parse_workers`` parse at once; more callers wait for one.

A worker is a fresh interpreter started with ``subprocess`` (``_worker``,
``python -P -c BOOTSTRAP``), not a multiprocessing child: multiprocessing's
spawn and forkserver prepare each child by importing the caller's ``__main__``
again, which re-runs a script that has no ``if __name__ == "__main__":`` guard
(every file then failed, "the parser process died") and fails for code piped to
``python -``; fork would copy the caller's threads' locks and its connections.
A fresh interpreter inherits none of them (``close_fds``), imports the parsers
once (about a second) and then parses file after file, so a small file costs a
pipe round trip instead of a process (``scripts/bench_parse.py``,
``docs/benchmarks.md``). It gets the caller's ``sys.path``, as a spawned child
would, so a parse function of the caller's own modules can be sent to it.

A small file is not a cheap one (4 KB of nested YAML flow mappings in a front
matter take PyYAML 0.7 s), so one rule holds for every file: no size needs to
be trusted.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from strata.errors import IndexingStoppedError, LoaderError
from strata.indexing.loaders._frames import STOPPED, TICK_S, FrameChannel
from strata.indexing.loaders._limits import LoaderLimits, setting
from strata.indexing.loaders._text import Parsed

logger = logging.getLogger(__name__)

Parse = Callable[[bytes, LoaderLimits], Parsed]

# How a worker's interpreter can die at its address-space cap instead of raising MemoryError: a C stack that
# cannot grow (SIGSEGV; the parse thread's stack is mapped up front, ``_worker.PARSE_STACK_BYTES``), CPython's
# "Cannot recover from MemoryErrors while normalizing exceptions" (SIGABRT), a failed page fault (SIGBUS). The
# pool cannot see the worker's memory once it is gone, so the failure names the setting as a cause it can be.
_MEMORY_DEATHS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS})
START_TIMEOUT_S = 120.0  # a worker importing the parsers on a loaded machine; not part of any file's time
_BOOTSTRAP = (
    "import sys, json; sys.path[:] = json.loads(sys.argv[1]); from strata.indexing.loaders._worker import main; main()"
)


def parse_isolated(parse: Parse, raw: bytes, limits: LoaderLimits, stop: threading.Event | None = None) -> Parsed:
    """``parse(raw, limits)`` in a parse worker; ``LoaderError`` when it fails, runs out of time or memory."""
    parsed: Parsed = POOL.parse(parse, raw, limits, stop)
    return parsed


def run_isolated(
    job: Callable[[bytes, LoaderLimits], Any], raw: bytes, limits: LoaderLimits, stop: threading.Event | None = None
) -> Any:
    """Another job on a parse worker, under the same caps: ``job(raw, limits)``'s value, which must pickle
    (the indexer counts a document's terms there, ``strata.indexing.term_counting``). ``LoaderError`` as for a
    parse."""
    return POOL.parse(job, raw, limits, stop)


class ParseWorker:
    """One worker process and the pool's end of its pipes."""

    def __init__(self, stop: threading.Event | None) -> None:
        try:
            self.process = subprocess.Popen(
                _start_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True, env=_worker_env()
            )
        except OSError as exc:
            raise LoaderError(f"the parser process could not start: {exc}") from exc
        assert self.process.stdin is not None and self.process.stdout is not None
        self._channel = FrameChannel(os.dup(self.process.stdin.fileno()), os.dup(self.process.stdout.fileno()))
        self.process.stdin.close()
        self.process.stdout.close()
        try:
            self._ready(stop)
        except BaseException:
            self.kill()
            raise
        logger.debug("parse worker %d started", self.pid)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def parse(self, parse: Parse, raw: bytes, limits: LoaderLimits, stop: threading.Event | None) -> tuple[Any, ...]:
        """``(outcome, value, retire)`` from the worker. ``BrokenPipeError`` when it was gone before it took
        the file, ``EOFError`` when it died with it, ``TimeoutError``, ``IndexingStoppedError``."""
        deadline = time.monotonic() + limits.parse_timeout_s
        self._channel.send([pickle.dumps((parse, limits)), raw], deadline, stop)
        answer = pickle.loads(self._channel.receive(deadline, stop))
        return tuple(answer)

    def death(self) -> str:
        """How the worker ended, once its pipe closed: "exit code 1", "killed by SIGKILL"."""
        try:
            code = self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "it stopped answering"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit code {code}"

    def kill(self) -> None:
        self._channel.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def forget(self) -> None:
        """In a forked child: let go of the pipes without touching the process, which is the parent's."""
        self._channel.close()

    def _ready(self, stop: threading.Event | None) -> None:
        try:
            hello = pickle.loads(self._channel.receive(time.monotonic() + START_TIMEOUT_S, stop))
        except EOFError:
            raise LoaderError(f"the parser process could not start ({self.death()}); see its error above") from None
        except TimeoutError:
            raise LoaderError(f"the parser process did not start within {START_TIMEOUT_S:g} s") from None
        if hello != ("ready", self.process.pid):
            raise LoaderError(f"the parser process answered {hello!r} instead of being ready")


def _start_command() -> list[str]:
    """``python -P -c BOOTSTRAP SYS_PATH PARENT_PID``: the parsers and the caller's ``sys.path``, never its
    ``__main__`` (``-P``: not the current folder either, until ``sys.path`` is set)."""
    return [sys.executable, "-P", "-c", _BOOTSTRAP, json.dumps(sys.path), str(os.getpid())]


def _worker_env() -> dict[str, str]:
    """The caller's environment, and one malloc arena: a worker parses on a thread of its own, and glibc
    would give that thread an arena that reserves 64 MB of address space at a time, so that ``RLIMIT_AS``
    would bound the parse's memory in 64 MB steps (or not at all within a reservation) instead of to the
    byte; with one arena every allocation maps what it uses, as on the main thread."""
    return {**os.environ, "MALLOC_ARENA_MAX": "1"}


class ParsePool:
    """At most ``LoaderLimits.parse_workers`` workers parsing at once, each kept for the next file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._idle: list[ParseWorker] = []
        self._busy_workers: dict[int, ParseWorker] = {}
        self._busy = 0  # callers holding a slot (a worker, or starting one)
        self._size = 1
        os.register_at_fork(after_in_child=self._after_fork)
        atexit.register(self.close)

    def parse(
        self,
        parse: Callable[[bytes, LoaderLimits], Any],
        raw: bytes,
        limits: LoaderLimits,
        stop: threading.Event | None,
    ) -> Any:
        self._enter(limits.parse_workers, stop)
        try:
            outcome, value = self._parse_in_slot(parse, raw, limits, stop)
        finally:
            self._leave()
        if outcome != "parsed":
            raise LoaderError(value)
        return value

    def busy_pids(self) -> list[int]:
        """The process ids of the workers parsing now."""
        with self._lock:
            return list(self._busy_workers)

    def close(self) -> None:
        """Kills every idle worker (at exit; a busy one is killed by the caller waiting on it)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()

    def _parse_in_slot(
        self, parse: Parse, raw: bytes, limits: LoaderLimits, stop: threading.Event | None
    ) -> tuple[str, Any]:
        for _ in range(2):
            worker = self._idle_worker() or ParseWorker(stop)
            with self._lock:
                self._busy_workers[worker.pid] = worker
            try:
                outcome, value, keep = _ask(worker, parse, raw, limits, stop)
            except BrokenPipeError:  # it had died before it took this file: the file never reached a parser
                worker.kill()
                continue
            except BaseException:
                worker.kill()
                raise
            finally:
                with self._lock:
                    self._busy_workers.pop(worker.pid, None)
            if keep:
                self._park(worker)
            else:
                worker.kill()
            return outcome, value
        return "failed", "the parser process died before it took this file, twice"

    def _enter(self, size: int, stop: threading.Event | None) -> None:
        """Waits until fewer than ``size`` workers parse (the latest caller's size holds)."""
        with self._free:
            self._size = size
            while self._busy >= self._size:
                if stop is not None and stop.is_set():
                    raise IndexingStoppedError(STOPPED)
                self._free.wait(TICK_S)
            self._busy += 1

    def _leave(self) -> None:
        with self._free:
            self._busy -= 1
            self._free.notify()

    def _idle_worker(self) -> ParseWorker | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                worker = self._idle.pop()
            if worker.alive():
                return worker
            worker.kill()  # died while idle (killed from outside): it had no file

    def _park(self, worker: ParseWorker) -> None:
        with self._lock:
            if len(self._idle) < self._size:
                self._idle.append(worker)
                return
        worker.kill()

    def _after_fork(self) -> None:
        """In a forked child: the workers are the parent's; this process starts its own when it parses."""
        for worker in [*self._idle, *self._busy_workers.values()]:
            worker.forget()
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._idle, self._busy_workers, self._busy = [], {}, 0


def _ask(
    worker: ParseWorker, parse: Parse, raw: bytes, limits: LoaderLimits, stop: threading.Event | None
) -> tuple[str, Any, bool]:
    """(outcome, value, whether the worker may parse again); ``BrokenPipeError`` when it never took the file."""
    try:
        outcome, value, retire = worker.parse(parse, raw, limits, stop)
    except EOFError:
        death = worker.death()
        failure = f"the parser process died ({death}) before it answered"
        if -(worker.process.returncode or 0) in _MEMORY_DEATHS:  # death() has reaped it
            limit = limits.parse_max_memory_bytes
            failure += f"; at {setting('parse_max_memory_bytes')} ({limit:,} bytes) a parse can end so"
        return "failed", failure, False
    except TimeoutError:
        timeout = limits.parse_timeout_s
        return "failed", f"parsing took longer than {setting('parse_timeout_s')} ({timeout:g} s) and was stopped", False
    return outcome, value, not retire


POOL = ParsePool()
