"""Connection limits of ``strata serve``: a header deadline, an idle keep-alive timeout, a cap on open connections.

uvicorn (0.54, h11; httptools is not installed and ``auto`` would pick h11 here
too, so the protocol is pinned) keeps a silent connection open forever: it has
a keep-alive timeout after an answer, but none for a connection that never
sends its headers, and no cap on how many are open. Each one is a file
descriptor, and once the process runs out of them asyncio's accept loop fails on
every pass and logs each failure (Python 3.11 retries the whole backlog per
pass): the service stops answering and floods its log.

``BoundedH11Protocol`` closes a connection that has not sent a request's
complete headers within ``header_timeout_s`` of opening (or of its previous
answer), and keeps at most ``max_connections`` open per process: at the cap, a
new connection closes the longest-idle one (no request in progress: silent,
headers half sent, or between requests), so a legitimate client still gets in
while an attacker's idle sockets are shed. Only when every connection has a
request in progress is the new one closed instead. The cap is set below the
open-file limit (raised to its hard limit at start) with room for the engine's
own files and for what asyncio accepts before a shed connection is closed, so
accept does not meet EMFILE.

Each close is counted once in ``strata_http_connections_closed{reason}`` (the
counter the app puts in its lifespan state under ``CLOSED_CONNECTIONS``) and
never logged: logging per attempt is what an attacker would use to fill the disk.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from strata.logs import LogSetup
from strata.logs import configure as configure_logs

if TYPE_CHECKING:  # a worker imports this module before it answers uvicorn's health check: nothing heavy
    from strata.config import ApiSettings

logger = logging.getLogger(__name__)

CLOSED_CONNECTIONS = "strata.closed_connections"  # lifespan-state key of the app's counter
BACKLOG = 128  # the listen queue, and how many connections asyncio accepts in one pass of its loop
# Passes of accepts that can run before a connection shed at the cap has its descriptor closed (the accept, the
# transport, connection_made, the close: one loop iteration each). Measured on --workers 2 under a hard limit
# of 1,024: with room for one pass of 256, a burst of 6,000 connects met EMFILE once; with four passes of 128,
# bursts of 6,000 and 10,000 never did.
ACCEPT_PASSES = 4
FD_RESERVE = 256  # the engine's own descriptors: store pools, gRPC channels, logs, model files, uploads, parses
_NO_HARD_LIMIT = 1 << 20  # Linux's default nr_open: the most a soft limit can be raised to without privileges
_ACCEPT_FAILED = "socket.accept() out of system resource"  # asyncio's message, logged with a traceback


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server process allows its connections (``max_connections`` already fitted to the fd limit)."""

    header_timeout_s: float
    keep_alive_s: float
    max_connections: int

    @classmethod
    def for_process(cls, api: ApiSettings, fd_limit: int) -> ConnectionLimits:
        """The settings' limits, the cap lowered (with a warning) to fit ``fd_limit`` open files."""
        from strata.config import ENV_PREFIX

        cap = connection_cap(api.max_connections, fd_limit)
        if cap < api.max_connections:
            logger.warning(
                "%sAPI__MAX_CONNECTIONS=%d does not fit %d open files: at most %d connections per process",
                ENV_PREFIX,
                api.max_connections,
                fd_limit,
                cap,
            )
        return cls(header_timeout_s=api.header_timeout_s, keep_alive_s=api.keep_alive_s, max_connections=cap)


def connection_cap(wanted: int, fd_limit: int) -> int:
    """At most ``wanted``, leaving ``FD_RESERVE`` and the accepts of ``ACCEPT_PASSES`` passes under ``fd_limit``."""
    return max(1, min(wanted, fd_limit - FD_RESERVE - ACCEPT_PASSES * BACKLOG))


def raise_open_file_limit() -> int:
    """Raises the soft RLIMIT_NOFILE to the hard one (workers inherit it); returns the soft limit in force."""
    import resource  # POSIX only, and only the server needs it

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _NO_HARD_LIMIT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            logger.warning("cannot raise the open-file limit from %d to %d: %s", soft, target, exc)
    return _NO_HARD_LIMIT if soft == resource.RLIM_INFINITY else soft


class ServeConfig(uvicorn.Config):
    """uvicorn's config serving with ``BoundedH11Protocol`` under ``limits``, logging as ``log_setup`` says
    (pickled whole to each worker)."""

    def __init__(
        self, app: Any, *, limits: ConnectionLimits, log_setup: LogSetup | None = None, **options: Any
    ) -> None:
        self.log_setup = log_setup or LogSetup()  # read by configure_logging, which uvicorn.Config.__init__ calls
        options.setdefault("log_config", None)  # uvicorn's loggers propagate to strata's handler
        # uvicorn annotates timeout_keep_alive as int but only hands it to the event loop's timer, which takes a float
        keep_alive: Any = limits.keep_alive_s
        super().__init__(app, http=BoundedH11Protocol, timeout_keep_alive=keep_alive, backlog=BACKLOG, **options)
        self.limits = limits

    def configure_logging(self) -> None:
        """strata's logging (``strata.logs``: every record through one handler, text or JSON), plus the
        accept-error filter: uvicorn calls this in the parent and again in each worker process."""
        super().configure_logging()  # with log_config None: only the access logger's switch
        configure_logs(self.log_setup)
        accept_log = logging.getLogger("asyncio")
        if not any(isinstance(f, AcceptErrorsOncePerMinute) for f in accept_log.filters):
            accept_log.addFilter(AcceptErrorsOncePerMinute())


class AcceptErrorsOncePerMinute(logging.Filter):
    """Lets one of asyncio's accept-failure records through per minute.

    Python 3.11's accept loop logs one per connection it fails to accept, the whole backlog again every second;
    the cap keeps a process below its open-file limit, and this keeps the log small should it be reached anyway
    (another program's descriptors, a lower system-wide limit).
    """

    def __init__(self) -> None:
        super().__init__()
        self._quiet_until = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(_ACCEPT_FAILED):
            return True
        now = time.monotonic()
        if now < self._quiet_until:
            return False
        self._quiet_until = now + 60.0
        return True


class ConnectionBook:
    """The open connections of one server process, the idle ones in the order they fell idle. No I/O."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: set[Hashable] = set()
        self._idle: dict[Hashable, None] = {}  # insertion order: longest idle first

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, conn: Hashable) -> Hashable | None:
        """Records a new (idle) connection; returns the one to close to stay within the cap (maybe ``conn``)."""
        self._open.add(conn)
        self._idle[conn] = None
        if len(self._open) <= self.cap:
            return None
        victim = next(iter(self._idle))  # ``conn`` itself only when every other connection has a request running
        self.closed(victim)
        return victim

    def busy(self, conn: Hashable) -> None:
        self._idle.pop(conn, None)

    def idle(self, conn: Hashable) -> None:
        """Marks ``conn`` idle; one already idle keeps its place (sending header bytes buys no time)."""
        if conn in self._open and conn not in self._idle:
            self._idle[conn] = None

    def closed(self, conn: Hashable) -> None:
        self._open.discard(conn)
        self._idle.pop(conn, None)

    def is_idle(self, conn: Hashable) -> bool:
        return conn in self._idle


_books: weakref.WeakKeyDictionary[ServerState, ConnectionBook] = weakref.WeakKeyDictionary()


def _book_of(server_state: ServerState, cap: int) -> ConnectionBook:
    """One book per uvicorn server (its connections share the ``ServerState``)."""
    book = _books.get(server_state)
    if book is None:
        book = _books[server_state] = ConnectionBook(cap)
    return book


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and the per-process cap (see the module docstring)."""

    def __init__(
        self,
        config: ServeConfig,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.limits = config.limits
        self.book = _book_of(server_state, self.limits.max_connections)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        victim = self.book.opened(self)
        if isinstance(victim, BoundedH11Protocol):
            victim.close_for("refused" if victim is self else "evicted")
        self._track()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._track()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_header_clock()
        self.book.closed(self)
        super().connection_lost(exc)

    def close_for(self, reason: str) -> None:
        """Closes the connection to keep a limit, counted once under ``reason`` (never logged)."""
        self._stop_header_clock()
        self.book.closed(self)
        if not self.transport.is_closing():
            counter = self.app_state.get(CLOSED_CONNECTIONS)
            if counter is not None:
                counter.labels(reason).inc()
            self.transport.close()

    def _track(self) -> None:
        """Idle (waiting for headers) runs the header clock and may be shed; a request in progress may not."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.book.busy(self)
            self._stop_header_clock()
        else:
            self.book.idle(self)
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _headers_late(self) -> None:
        self._header_timer = None
        self.close_for("header_timeout")

    def _stop_header_clock(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
