"""Parse functions that the tests send to a parse worker (``strata.indexing.loaders._isolated``).

A worker imports this module by name (it gets the test process's ``sys.path``), so it imports nothing heavy.
Each takes the file's bytes as its instruction: ``raw`` is a path the probe writes the worker's pid to.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from strata.indexing.loaders import LoaderLimits
from strata.indexing.loaders._text import Parsed
from strata.types import Section


def whoami(raw: bytes, limits: LoaderLimits) -> Parsed:
    """Parses to the worker's pid."""
    text = str(os.getpid())
    return Parsed(text, (Section((), 0, len(text)),), {})


def announce_and_hang(raw: bytes, limits: LoaderLimits) -> Parsed:
    """Writes the worker's pid to the file ``raw`` names, then waits for ever: the test kills it, or the
    parse's timeout does."""
    _announce(raw)
    threading.Event().wait()
    raise AssertionError("unreachable")


def announce_and_grow(raw: bytes, limits: LoaderLimits) -> Parsed:
    """Writes the worker's pid to the file ``raw`` names, then allocates twice the parse's memory cap."""
    _announce(raw)
    held = bytearray(2 * limits.parse_max_memory_bytes)
    return whoami(bytes(len(held) % 2), limits)


def fill_then_recurse(raw: bytes, limits: LoaderLimits) -> Parsed:
    """Allocates until the parse's memory cap refuses, then, with the address space full, recurses deeper in
    C than anything before it (comparing two lists nested 900 deep), then lets the memory go: the worker must
    survive to answer that the parse ran out of memory."""
    nested, other = [], []  # type: ignore[var-annotated]
    for _ in range(900):
        nested, other = [nested], [other]
    held = []
    for size in (1 << 20, 1 << 12, 64):
        try:
            while True:
                held.append(bytearray(size))
        except MemoryError:
            pass
    equal = nested == other
    del held
    raise MemoryError(f"filled, then compared {equal}")


def fill_then_abort(raw: bytes, limits: LoaderLimits) -> Parsed:
    """Fills the parse's memory cap with pages it writes to, then dies of SIGABRT, as CPython does when it
    "cannot recover from MemoryErrors": no answer, only the memory it held tells why."""
    _fill(1 << 20)
    os.abort()


def _fill(chunk: int) -> list[bytearray]:
    held = []
    try:
        while True:
            block = bytearray(chunk)
            block[:: 1 << 12] = b"x" * len(range(0, chunk, 1 << 12))  # a write to every page makes it resident
            held.append(block)
    except MemoryError:
        return held


def _announce(raw: bytes) -> None:
    path = Path(raw.decode())
    partial = path.with_suffix(".partial")
    partial.write_text(str(os.getpid()))
    partial.rename(path)  # whole or absent: the test reads it as soon as it exists


def announce_and_hang_tokens(announce_to: str, text: str) -> list[str]:
    """A tokenizer (``functools.partial(announce_and_hang_tokens, path)``) for a term count on a worker: writes
    the worker's pid to ``announce_to``, then waits for ever: the test kills the worker, or the timeout does."""
    _announce(announce_to.encode())
    threading.Event().wait()
    raise AssertionError("unreachable")
