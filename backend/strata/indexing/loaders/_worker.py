"""A parse worker: a process of its own that parses file after file for the pool in ``_isolated``.

Started as ``python -P -c BOOTSTRAP SYS_PATH PARENT_PID`` (``_isolated._start_command``): a fresh
interpreter that imports strata's parsers and nothing of its parent's, then serves requests read from its
stdin and answers on its stdout, as length-prefixed pickles (``_frames``):

- it says ``("ready", pid)`` once the parsers are imported;
- a request is two frames, ``pickle((parse, limits))`` and the file's bytes; the answer is one frame,
  ``pickle((outcome, value, retire))``: ``("parsed", Parsed)`` or ``("failed", reason)``, and whether the
  worker leaves after it (``retire``: it ran out of memory, or it grew, see ``_RETIRE_GROWTH``).

Each parse runs on a thread with a stack of its own (``PARSE_STACK_BYTES``), under ``RLIMIT_AS`` at the
worker's size plus ``parse_max_memory_bytes`` (lifted again before the answer is sent, so that the next
request can be read whole), and ``RLIMIT_CPU`` at the CPU it has used plus ``parse_timeout_s``: the pool
kills the worker at that wall-clock time first, and the CPU limit ends a worker whose pool is gone while it
parses. A worker whose parent is gone ends at once: at the
end of file of its stdin between files, and through a thread that watches its parent's pid while it parses.
"""

from __future__ import annotations

import gc
import importlib
import math
import os
import pickle
import resource
import sys
import threading
import time
import traceback
from typing import Any

from strata.errors import LoaderError
from strata.indexing.loaders._frames import read_frame, write_frames
from strata.indexing.loaders._limits import LoaderLimits, out_of_memory
from strata.indexing.loaders._text import Parsed, reason

PARSERS = tuple(f"strata.indexing.loaders.{name}" for name in ("_docx", "_pdf", "_html", "_markdown", "_rst"))
_NEAR_CAP = 64 * 1024 * 1024
_RETIRE_GROWTH = 64 * 1024 * 1024  # a worker whose address space peaked this far above its start leaves
_WATCH_S = 0.5
# Parsing is background work beside the queries a service answers: a worker runs this much nicer than its
# parent, so a hostile upload's parse takes the CPU the queries leave (Linux's weight for nice 10 is a tenth of
# nice 0's) instead of half of it.
NICENESS = 10
# Parses run on a thread whose stack is mapped whole when it starts. The main thread's stack grows a page at
# a time, and growing needs address space: a parse that ran out of it under RLIMIT_AS (a MemoryError the
# worker answers) and then recursed deeper in C than before, while unwinding or finalising, died of SIGSEGV
# instead. This size holds any C recursion Python's recursion limit allows; it is address space, not memory.
PARSE_STACK_BYTES = 64 * 1024 * 1024


def main() -> None:
    """The worker's life: take its pipes, import the parsers, say ready, serve until its stdin ends."""
    parent = int(sys.argv[2])
    os.nice(NICENESS)
    requests, answers = _private_pipes()
    threading.Thread(target=_watch_parent, args=(parent,), name="strata-parse-watch", daemon=True).start()
    for name in PARSERS:
        importlib.import_module(name)
    gc.freeze()  # the imported modules' objects stay out of every later collection
    serving = threading.Thread(target=_serve_or_exit, args=(requests, answers), name="strata-parse")
    threading.stack_size(PARSE_STACK_BYTES)  # read when the thread starts
    serving.start()
    threading.stack_size(0)
    serving.join()


_baseline = {"peak": 0}  # the address space peak a worker's growth is measured from (``_RETIRE_GROWTH``)


def keep_resident() -> None:
    """For a job that loads, once, what the worker is meant to keep (jieba's dictionary, ``term_counting``):
    the worker's growth is measured from its peak now, so it is not retired for holding it."""
    _baseline["peak"] = _address_space("VmPeak") or 0


def _serve_or_exit(requests: int, answers: int) -> None:
    try:
        _serve_requests(requests, answers)
    except BaseException:  # as the main thread would: the traceback on stderr, exit code 1
        traceback.print_exc()
        os._exit(1)


def _serve_requests(requests: int, answers: int) -> None:
    """Reads request after request and answers each, until stdin ends or the worker retires."""
    _baseline["peak"] = _address_space("VmPeak") or 0
    write_frames(answers, [pickle.dumps(("ready", os.getpid()))])
    while (meta := read_frame(requests)) is not None:
        raw = read_frame(requests)
        if raw is None:
            return
        outcome, value, memory_spent = _serve(meta, raw)
        del raw
        retire = memory_spent or (_address_space("VmPeak") or 0) > _baseline["peak"] + _RETIRE_GROWTH
        write_frames(answers, [_answer(outcome, value, retire)])
        if retire:
            return


def _serve(meta: bytes, raw: bytes) -> tuple[str, Any, bool]:
    try:
        parse, limits = pickle.loads(meta)
    except Exception as exc:  # a parse function this interpreter cannot import
        return "failed", f"the parser process cannot run this parse: {type(exc).__name__}: {reason(exc)}", False
    return _parse(parse, raw, limits)


def _answer(outcome: str, value: Any, retire: bool) -> bytes:
    try:
        return pickle.dumps((outcome, value, retire), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # metadata that does not pickle
        return pickle.dumps(("failed", f"parser error: {type(exc).__name__}: {reason(exc)}", retire))


def _private_pipes() -> tuple[int, int]:
    """The request and answer pipes, moved off fds 0 and 1: a parser that prints writes to stderr instead
    of into an answer, and one that reads stdin reads nothing."""
    requests, answers = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    return requests, answers


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_WATCH_S)
    os._exit(1)  # orphaned: nobody reads the answer


def _parse(parse: Any, raw: bytes, limits: LoaderLimits) -> tuple[str, Any, bool]:
    """(outcome, value, whether the parse ran out of memory) for one file, under the caps."""
    peak_before = _address_space("VmPeak")
    cap = _cap_address_space(limits.parse_max_memory_bytes)
    _cap_cpu(limits.parse_timeout_s)
    try:
        return _parsed_or_failed(parse, raw, limits, cap, peak_before)
    finally:
        _lift_caps()


def _parsed_or_failed(
    parse: Any, raw: bytes, limits: LoaderLimits, cap: int | None, peak_before: int | None
) -> tuple[str, Any, bool]:
    failure, refused = "", False
    try:
        parsed = parse(raw, limits)
    except MemoryError:  # under the cap, an allocation the cap refused (one too big for it alone included)
        failure, refused = "out of memory", cap is not None
    except LoaderError as exc:
        failure = str(exc) or "out of memory"
    except Exception as exc:  # a parser bug: the file fails with it, the run goes on
        failure = f"parser error: {type(exc).__name__}: {reason(exc)}"
    del raw
    if failure:
        # Outside the except clause: the traceback, and the parse's objects its frames held, are let go, and
        # what is left in reference cycles (docutils' tree: each node points to its parent) collected, so
        # that the answer can be built and sent at all (it died with MemoryError in the handler before).
        gc.collect()
        # lxml reports a failed allocation as a syntax error ("unknown error"): the peak tells
        spent = refused or _reached(cap, peak_before)
        return "failed", out_of_memory(limits) if spent else failure, spent
    if not isinstance(parsed, Parsed):  # another job's value (``_isolated.run_isolated``)
        return "parsed", parsed, False
    try:
        limits.check_document(parsed.text)
    except LoaderError as exc:
        return "failed", str(exc), False
    except MemoryError:
        return "failed", out_of_memory(limits), True
    return "parsed", parsed, False


def _cap_address_space(extra_bytes: int) -> int | None:
    """RLIMIT_AS at this process's current size plus ``extra_bytes``; the cap, or None where there is no
    /proc (there the timeout still holds)."""
    current = _address_space("VmSize")
    if current is None:
        return None
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    wanted = current + extra_bytes
    cap = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    return cap


def _cap_cpu(timeout_s: float) -> None:
    """RLIMIT_CPU (SIGXCPU ends the process) at the CPU seconds used so far plus ``timeout_s`` and one."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    wanted = math.ceil(used.ru_utime + used.ru_stime + timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard), hard))


def _lift_caps() -> None:
    for limit in (resource.RLIMIT_AS, resource.RLIMIT_CPU):
        _, hard = resource.getrlimit(limit)
        resource.setrlimit(limit, (hard, hard))


def _reached(cap: int | None, peak_before: int | None) -> bool:
    """Whether this parse took the address space near ``cap`` (an allocation that failed there).

    The peak is the worker's since it started: when an earlier file's peak is already that high (a cap far
    under ``_RETIRE_GROWTH``), any growth of the peak during this parse counts.
    """
    peak = _address_space("VmPeak")
    if cap is None or peak is None:
        return False
    if peak_before is not None and peak_before > cap - _NEAR_CAP:
        return peak > peak_before
    return peak > cap - _NEAR_CAP


def _address_space(field: str) -> int | None:
    """``VmSize`` or ``VmPeak`` of this process in bytes, from /proc/self/status (Linux)."""
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith(f"{field}:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024  # "VmPeak:   123456 kB"
