"""A client-side deadline on every call a connection makes: past it, the connection is cut.

A database whose processes are paused (SIGSTOP, a frozen host or VM) leaves a call waiting on a socket the
kernel keeps open and acknowledges: no server-side timeout can fire, TCP keepalives are answered, and the
caller waits forever. ``CallWatchdog`` holds the deadline of each call in progress (the tighter of the
database's call timeout and what is left of the request the call serves) and one thread that waits for the
earliest; when it passes, ``cut`` ends the call from outside (``SqlDatabase`` shuts the
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
Why = TypeVar("Why")


class CallWatchdog(Generic[Conn, Why]):
    """The deadlines of the calls in progress, one per connection, and the thread that cuts late ones.

    A call costs a dictionary write under a lock. Each call has a timeout of its own (a request's remaining
    deadline may be shorter than ``timeout_s``) and a ``why`` (what set it: the error of a cut call names
    it). The thread sleeps until the earliest deadline, woken when a call is armed with an earlier one, and
    ends after a sleep of one ``timeout_s`` during which nothing was armed; the next call starts another.
    ``cut`` runs on that thread under the lock, so a connection disarmed before it is closed is never cut
    after, and returns whether it cut: it may decline a connection whose call ended without a ``disarm`` (a
    commit has no event after it). Which thread's call was cut, and why, is kept until that thread's next
    call, so the error it raises can be told from a disconnect.
    """

    def __init__(self, timeout_s: float, cut: Callable[[Conn], bool]) -> None:
        self.timeout_s = timeout_s
        self._cut = cut
        self._deadlines: dict[Conn, tuple[float, int, Why | None]] = {}
        self._cut_threads: dict[int, Why | None] = {}
        self._armed = 0
        self._lock = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._wake = 0.0  # when the thread's sleep ends

    def arm(self, conn: Conn, timeout_s: float | None = None, why: Why | None = None) -> None:
        """``conn`` starts a call on this thread: it is cut unless it ends (``disarm``) or another call starts
        within ``timeout_s`` (default: the watchdog's)."""
        thread = threading.get_ident()
        limit = self.timeout_s if timeout_s is None else max(0.0, timeout_s)
        with self._lock:
            self._cut_threads.pop(thread, None)
            deadline = time.monotonic() + limit
            self._deadlines[conn] = (deadline, thread, why)
            self._armed += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="sql-call-watchdog", daemon=True)
                self._thread.start()
            elif deadline < self._wake:
                self._lock.notify()  # its sleep would end after this call's deadline

    def disarm(self, conn: Conn) -> None:
        """``conn``'s call ended (or it is about to be closed)."""
        with self._lock:
            self._deadlines.pop(conn, None)

    def was_cut(self) -> bool:
        """Whether the last call of this thread was cut."""
        with self._lock:
            return threading.get_ident() in self._cut_threads

    def why_cut(self) -> Why | None:
        """The ``why`` of this thread's last call when it was cut (None: not cut, or armed without one)."""
        with self._lock:
            return self._cut_threads.get(threading.get_ident())

    def _watch(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                for conn, (deadline, thread, why) in list(self._deadlines.items()):
                    if deadline <= now:
                        del self._deadlines[conn]
                        if self._cut_safely(conn):
                            self._cut_threads[thread] = why
                wake = min((deadline for deadline, _, _ in self._deadlines.values()), default=now + self.timeout_s)
                armed, self._wake = self._armed, wake
                self._lock.wait(max(0.0, wake - now))
                if not self._deadlines and self._armed == armed:
                    self._thread = None
                    return

    def _cut_safely(self, conn: Conn) -> bool:
        try:
            return self._cut(conn)
        except Exception:  # the thread must live on: every later call depends on it
            logger.exception("could not cut a database connection whose call outlived its deadline")
            return False
