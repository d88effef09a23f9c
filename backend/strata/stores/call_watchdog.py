"""A client-side deadline on every call a connection makes: past it, the connection is cut.

A database whose processes are paused (SIGSTOP, a frozen host or VM) leaves a call waiting on a socket the
kernel keeps open and acknowledges: no server-side timeout can fire, TCP keepalives are answered, and the
caller waits forever. ``CallWatchdog`` holds the deadline of each call in progress and one thread that
waits for the earliest; when it passes, ``cut`` ends the call from outside (``SqlDatabase`` shuts the
connection's socket down, so the blocked call fails at once).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

Conn = TypeVar("Conn", bound=Hashable)


class CallWatchdog(Generic[Conn]):
    """The deadlines of the calls in progress, one per connection, and the thread that cuts late ones.

    A call costs a dictionary write under a lock. The thread sleeps until the earliest deadline, or for one
    timeout when nothing is armed (a call armed meanwhile falls due no sooner), and ends after a sleep during
    which nothing was armed; the next call starts another. ``cut`` runs on that thread under the lock, so a
    connection disarmed before it is closed is never cut after, and returns whether it cut: it may decline
    a connection whose call ended without a ``disarm`` (a commit has no event after it). Which thread's call
    was cut is kept until that thread's next call, so the error it raises can be told from a disconnect.
    """

    def __init__(self, timeout_s: float, cut: Callable[[Conn], bool]) -> None:
        self.timeout_s = timeout_s
        self._cut = cut
        self._deadlines: dict[Conn, tuple[float, int]] = {}
        self._cut_threads: set[int] = set()
        self._armed = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def arm(self, conn: Conn) -> None:
        """``conn`` starts a call on this thread: it is cut unless it ends (``disarm``) or another call starts
        within the timeout."""
        thread = threading.get_ident()
        with self._lock:
            self._cut_threads.discard(thread)
            self._deadlines[conn] = (time.monotonic() + self.timeout_s, thread)
            self._armed += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="sql-call-watchdog", daemon=True)
                self._thread.start()

    def disarm(self, conn: Conn) -> None:
        """``conn``'s call ended (or it is about to be closed)."""
        with self._lock:
            self._deadlines.pop(conn, None)

    def was_cut(self) -> bool:
        """Whether the last call of this thread was cut."""
        with self._lock:
            return threading.get_ident() in self._cut_threads

    def _watch(self) -> None:
        while True:
            with self._lock:
                now = time.monotonic()
                for conn, (deadline, thread) in list(self._deadlines.items()):
                    if deadline <= now:
                        del self._deadlines[conn]
                        if self._cut_safely(conn):
                            self._cut_threads.add(thread)
                wake = min((deadline for deadline, _ in self._deadlines.values()), default=now + self.timeout_s)
                armed = self._armed
            time.sleep(wake - now)
            with self._lock:
                if not self._deadlines and self._armed == armed:
                    self._thread = None
                    return

    def _cut_safely(self, conn: Conn) -> bool:
        try:
            return self._cut(conn)
        except Exception:  # the thread must live on: every later call depends on it
            logger.exception("could not cut a database connection whose call outlived its deadline")
            return False
