"""Slots that hold across the worker processes of one service: ``--workers N`` does not multiply a key's share.

A slot is an exclusive ``flock`` on a small file, held through an open descriptor: slot ``i`` of the group
``key-1a2b3c4d`` is ``key-1a2b3c4d.i`` in the folder every worker of the service shares (``STRATA_SLOTS_DIR``,
a private temporary folder ``strata serve`` makes for its workers and removes at exit). Taking a slot tries
the group's files in turn without blocking; giving it back closes the descriptor.

Why locks and not a count: a counter (in a file, shared memory or Redis) is decremented by the process that
incremented it, and a worker killed in between (SIGKILL, the OOM killer, a segfault in a parser's C code)
leaves the count wrong for good, or until a lease expires, while its slot stays taken. A lock is released by
the kernel when its descriptor closes, and every descriptor of a process closes when it dies, however it dies:
no lease to tune, no count to repair, nothing to clean at start (a file left by an earlier run is an unlocked
slot). Locks on two descriptors of one process conflict as locks of two processes do, so one process needs no
bookkeeping of its own either. The limit of the design: the folder is one host's, so a share holds across
the workers of one ``strata serve`` (one pod), not across pods.

Without a shared folder (one process: ``strata serve`` with one worker, tests, the library) ``LocalSlots`` counts
in memory behind the same ``Slots`` protocol.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

logger = logging.getLogger(__name__)

SLOTS_DIR = "STRATA_SLOTS_DIR"  # set by ``strata serve --workers N`` for its workers (config_help.NOT_SETTINGS)
_GROUP = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Slots(Protocol):
    """Numbered slots per group, taken without waiting."""

    def take(self, group: str, size: int) -> Held | None:
        """One of ``group``'s ``size`` slots, or None when all are taken (by any process sharing them)."""
        ...

    def release(self, held: Held) -> None:
        """Gives back a slot ``take`` returned."""
        ...


class Held:
    """A slot taken: its group and, for a file slot, the descriptor holding its lock."""

    __slots__ = ("fd", "group")

    def __init__(self, group: str, fd: int = -1) -> None:
        self.group, self.fd = group, fd


class FileSlots:
    """Slots as ``flock`` locks on files in ``folder``, shared by every process that uses the same folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def take(self, group: str, size: int) -> Held | None:
        _check_group(group)
        for index in range(size):
            fd = os.open(self.folder / f"{group}.{index}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
                continue
            return Held(group, fd)
        return None

    def release(self, held: Held) -> None:
        if held.fd >= 0:
            os.close(held.fd)  # closing the descriptor is what releases the lock
            held.fd = -1


class LocalSlots:
    """Slots of one process, counted in memory (thread-safe)."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()
        self._guard = threading.Lock()

    def take(self, group: str, size: int) -> Held | None:
        with self._guard:
            if self._held[group] >= size:
                return None
            self._held[group] += 1
        return Held(group)

    def release(self, held: Held) -> None:
        with self._guard:
            self._held[held.group] -= 1
            if self._held[held.group] <= 0:
                del self._held[held.group]


def shared_from_environment() -> FileSlots | None:
    """The slots this process shares with the other workers of its service (``STRATA_SLOTS_DIR``), or None."""
    folder = os.environ.get(SLOTS_DIR)
    return FileSlots(Path(folder)) if folder and Path(folder).is_dir() else None


def slots_from_environment() -> Slots:
    """The slots of this process's service: shared through ``STRATA_SLOTS_DIR`` when it is set, else local."""
    return shared_from_environment() or LocalSlots()


@contextmanager
def shared_slots_dir(workers: int) -> Iterator[Path | None]:
    """With several workers, a private folder for their slots in ``STRATA_SLOTS_DIR`` (inherited by the
    workers), removed at exit; None for one process, whose slots are its own."""
    if workers == 1:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="strata-slots-"))  # mode 0700: the service's own
    os.environ[SLOTS_DIR] = str(path)
    logger.info("slots of %d workers are shared in %s", workers, path)
    try:
        yield path
    finally:
        os.environ.pop(SLOTS_DIR, None)
        shutil.rmtree(path, ignore_errors=True)


def _check_group(group: str) -> None:
    # A bug if it raises: groups come from strata's own names, never a key's text or a path (not input).
    if not _GROUP.match(group):
        raise ValueError(f"not a slot group name: {group!r}")
