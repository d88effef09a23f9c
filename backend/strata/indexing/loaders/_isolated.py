"""Parsing a file in a child process that can be killed: bounded in time and memory, and stoppable.

python-docx, pypdf, lxml and PyYAML run in C and Python loops that no check
inside strata can interrupt, and a parse in the service's own process holds
its interpreter lock: a slow one froze every request. So each parse,
of every format, runs in a child process. The parent
waits for its answer at most ``parse_timeout_s``, then kills it and fails the
file; the child caps its own address space at what it had when it started plus
``parse_max_memory_bytes``, so a parse that needs more fails with
``MemoryError`` (reported as such) instead of growing the service. A text
over ``max_document_bytes`` fails in the child, so the parent never receives
it. A ``stop`` event set while the parent waits (the service is shutting down)
kills the child and raises ``IndexingStoppedError``.

The children are forked by a forkserver that has imported the parsers: a child
starts in milliseconds (a fresh interpreter would import lxml, python-docx and
pypdf again, a second or more each time), and none of the parent's threads,
locks or connections come with it.

Small files go through the child too. A child costs 8-11 ms per file on a
2-core VM against 0.3-1.6 ms for parsing a 3 KB Markdown or HTML file in
place (``docs/benchmarks.md``): about 100 s per 10,000 files, while a small
file is not a cheap one: 4 KB of nested YAML flow mappings in a front matter
take PyYAML 0.7 s, and one rule for every file needs no size to be trusted.
"""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.util
import resource
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from types import ModuleType
from typing import Any

from strata.errors import IndexingStoppedError, LoaderError
from strata.indexing.loaders._limits import LoaderLimits, setting
from strata.indexing.loaders._text import Parsed, reason

Parse = Callable[[bytes, LoaderLimits], Parsed]

_CONTEXT = multiprocessing.get_context("forkserver")
_PARSERS = [f"strata.indexing.loaders.{name}" for name in ("_docx", "_pdf", "_html", "_markdown", "_rst")]
_POLL_S = 0.1  # how soon a set stop event is seen


def parse_isolated(parse: Parse, raw: bytes, limits: LoaderLimits, stop: threading.Event | None = None) -> Parsed:
    """``parse(raw, limits)`` in a child process; ``LoaderError`` when it fails, runs out of time or memory."""
    _CONTEXT.set_forkserver_preload(_preload())  # takes effect when the first parse starts the forkserver
    _short_socket_folder()
    receiver, sender = _CONTEXT.Pipe(duplex=False)
    child = _CONTEXT.Process(
        target=_parse_in_child, args=(parse, raw, limits, sender), name="strata-parse", daemon=True
    )
    child.start()
    sender.close()  # the child holds the only writer: its death reads as end of file
    try:
        outcome, value = _answer(child, receiver, limits, stop)
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receiver.close()
    if outcome != "parsed":
        raise LoaderError(value)
    return value


def _short_socket_folder() -> None:
    """Gives multiprocessing a temporary folder short enough for the forkserver's Unix socket.

    The forkserver listens on a socket in multiprocessing's temporary folder (``pymp-*`` under ``TMPDIR``); a
    Unix socket's path is at most 107 bytes on Linux, so under a long ``TMPDIR`` (a deep working folder, a
    test's own) starting it failed with "AF_UNIX path too long" and so did every parse. Then the folder is made
    under ``/tmp`` (or the shortest writable of the usual places) and removed at exit.
    """
    config = multiprocessing.current_process()._config  # type: ignore[attr-defined]  # what multiprocessing.util.get_temp_dir() reads
    if config.get("tempdir") or len(tempfile.gettempdir()) <= _SOCKET_FOLDER_MAX:
        return
    for parent in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            folder = tempfile.mkdtemp(prefix="pymp-", dir=parent)
        except OSError:
            continue
        multiprocessing.util.Finalize(None, shutil.rmtree, args=[folder, True], exitpriority=-100)
        config["tempdir"] = folder
        return


_SOCKET_FOLDER_MAX = 60  # a TMPDIR this long leaves room for "/pymp-XXXXXXXX/listener-XXXXXXXX" under 107 bytes


def _preload() -> list[str]:
    """The parsers' modules, and those the main script's names come from.

    Each child runs the main script's imports again (multiprocessing prepares it as a spawned process;
    preloading ``"__main__"`` does nothing in Python 3.11): for the ``strata`` command that is importing
    ``strata.cli``, 0.4 s a file (measured: 400 ms against 10 ms per 3 KB file) unless the forkserver
    has imported it already.
    """
    names: set[str | None] = set()
    for value in vars(sys.modules["__main__"]).values():
        names.add(value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None))
    # Only modules this process has imported by those names: they import again without surprises.
    imported = sorted(n for n in names if isinstance(n, str) and n in sys.modules and n not in _MAIN_NAMES)
    return [*_PARSERS, *imported]


_MAIN_NAMES = ("__main__", "__mp_main__")


def _answer(child: Any, receiver: Connection, limits: LoaderLimits, stop: threading.Event | None) -> tuple[str, Any]:
    deadline = time.monotonic() + limits.parse_timeout_s
    while not receiver.poll(_POLL_S):
        if stop is not None and stop.is_set():
            raise IndexingStoppedError("indexing stopped while parsing this file: the service is shutting down")
        if time.monotonic() >= deadline:
            raise LoaderError(
                f"parsing took longer than {setting('parse_timeout_s')} ({limits.parse_timeout_s:g} s) and was stopped"
            )
    try:
        return receiver.recv()
    except EOFError:
        child.join()
        return "failed", f"the parser process died (exit code {child.exitcode}) before it answered"


def _parse_in_child(parse: Parse, raw: bytes, limits: LoaderLimits, sender: Connection) -> None:
    cap = _cap_address_space(limits.parse_max_memory_bytes)
    failure = ""
    try:
        answer: tuple[str, Any] = ("parsed", parse(raw, limits))
    except MemoryError:
        failure = "out of memory"
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
        answer = ("failed", _out_of_memory(limits) if _reached(cap) else failure)
    if answer[0] == "parsed":
        answer = _within_document_limit(answer[1], limits)
    sender.send(answer)
    sender.close()


def _within_document_limit(parsed: Parsed, limits: LoaderLimits) -> tuple[str, Any]:
    """The answer for a parse that succeeded: failed when its text is over ``max_document_bytes``."""
    try:
        limits.check_document(parsed.text)
    except LoaderError as exc:
        return "failed", str(exc)
    except MemoryError:
        return "failed", _out_of_memory(limits)
    return "parsed", parsed


def _out_of_memory(limits: LoaderLimits) -> str:
    limit = limits.parse_max_memory_bytes
    return f"parsing needed more memory than {setting('parse_max_memory_bytes')} ({limit:,} bytes)"


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


def _reached(cap: int | None) -> bool:
    """Whether this process's address space came near ``cap`` (an allocation that failed there)."""
    peak = _address_space("VmPeak")
    return cap is not None and peak is not None and peak > cap - _NEAR_CAP


def _address_space(field: str) -> int | None:
    """``VmSize`` or ``VmPeak`` of this process in bytes, from /proc/self/status (Linux)."""
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith(f"{field}:"))
    except (OSError, StopIteration):
        return None
    return int(line.split()[1]) * 1024  # "VmPeak:   123456 kB"


_NEAR_CAP = 64 * 1024 * 1024
