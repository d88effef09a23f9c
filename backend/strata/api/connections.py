"""Connection limits of ``strata serve``: header and write deadlines, bounded pipelining, a cap on open connections.

uvicorn (0.54, h11; httptools is not installed and ``auto`` would pick h11 here
too, so the protocol is pinned) keeps a silent connection open forever: it has
a keep-alive timeout after an answer, but none for a connection that never
sends its headers, and no cap on how many are open. Each one is a file
descriptor, and once the process runs out of them asyncio's accept loop fails on
every pass and logs each failure (Python 3.11 retries the whole backlog per
pass): the service stops answering and floods its log.

A client that does not read is the other half: ``transport.close()`` waits for
unsent data, so a connection closed while its answer sat behind a full send
buffer kept its descriptor and buffer forever, out of the book's count, and a
request whose answer could not be written counted as busy forever.

``BoundedH11Protocol`` bounds every state a connection can be in:

- headers: a connection that has not sent a request's complete headers within
  ``header_timeout_s`` of opening (or of its previous answer) is reset;
- answers: the transport's write limits are zero, so ``pause_writing`` comes as
  soon as a byte of an answer is left unsent in this process and
  ``resume_writing`` when the last one leaves. A connection paused for
  ``write_timeout_s`` is reset, whatever it was doing (answering, between
  requests, or closing);
- the kernel: each connection's send buffer is ``send_buffer_bytes``
  (``SO_SNDBUF``). Left to autotuning it grew to 4 MiB on loopback for a client
  reading nothing, so eight pipelined 50 KB answers all "left" the process,
  each one rendered, and the kernel held them;
- pipelining: the next request is not started while bytes of the previous
  answer are unsent (one answer per connection in memory, and no work done for
  a client that is not reading once its buffers are full), and a connection may have
  ``max_pipelined_requests`` answered in a row whose next request was already
  waiting when the previous answer completed; it closes after the last.
  Reading stops while a request is answered (uvicorn), so at most one read of
  input waits per connection;
- the cap: at most ``max_connections`` open per process. A new connection
  resets one that waits on its client: first the longest *stalled* (an answer
  unsent: the client is not reading), then the longest *idle* (no request in
  progress: silent, headers half sent, between requests), so a legitimate
  client still gets in while an attacker's sockets are shed. Only when every
  connection has a request being served is the new one reset instead;
- shutdown: a connection between requests with an answer unsent is reset at
  once rather than closed (closing would wait for the client).

Every connection shed for a limit is *reset*: ``SO_LINGER`` 0 and
``transport.abort()``, so its descriptor and buffers go in the next loop pass
and the kernel drops what the client did not read. One that uvicorn closes
itself (keep-alive timeout, ``Connection: close``) stays in the book until its
socket is closed, unsent bytes bounded by the write deadline, so the book
counts descriptors, not intentions. The cap is set below the open-file limit
(raised to its hard limit at start) with room for the engine's own files and
for what asyncio accepts before a shed connection is closed, so accept does not
meet EMFILE.

Each reset is counted once in ``strata_http_connections_closed{reason}`` (the
counter the app puts in its lifespan state under ``CLOSED_CONNECTIONS``) and
never logged: logging per attempt is what an attacker would use to fill the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
import weakref
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from strata.api.malformed import ProblemBadRequest
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
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST and drops unsent data


@dataclass(frozen=True)
class ConnectionLimits:
    """What one server process allows its connections (``max_connections`` already fitted to the fd limit)."""

    header_timeout_s: float
    keep_alive_s: float
    max_connections: int
    # ApiSettings' defaults, for tests that set only the limits above (a test checks that they agree)
    write_timeout_s: float = 30.0
    max_pipelined_requests: int = 16
    send_buffer_bytes: int = 65536  # 0: the kernel's autotuning

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
        return cls(
            header_timeout_s=api.header_timeout_s,
            keep_alive_s=api.keep_alive_s,
            max_connections=cap,
            write_timeout_s=api.write_timeout_s,
            max_pipelined_requests=api.max_pipelined_requests,
            send_buffer_bytes=api.send_buffer_bytes,
        )


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
    """The open connections of one server process, and those waiting on their client in the order they began to
    wait: "stalled" (an answer left unsent: the client is not reading) before "idle" (no request in progress:
    silent, headers half sent, between requests). No I/O.

    Stalled ones go first at the cap: they hold memory, and a connection that has only just been accepted (idle,
    its request not yet read) must not be shed for them, or a flood of slow readers would shed every new client.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: set[Hashable] = set()
        self._stalled: dict[Hashable, None] = {}  # insertion order: longest stalled first
        self._idle: dict[Hashable, None] = {}  # insertion order: longest idle first

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, conn: Hashable) -> Hashable | None:
        """Records a new (idle) connection; returns the one to close to stay within the cap (maybe ``conn``)."""
        self._open.add(conn)
        self._idle[conn] = None
        if len(self._open) <= self.cap:
            return None
        # ``conn`` itself only when every other connection has a request running that is not stalled
        victim = next(iter(self._stalled)) if self._stalled else next(iter(self._idle))
        self.closed(victim)
        return victim

    def busy(self, conn: Hashable) -> None:
        self._stalled.pop(conn, None)
        self._idle.pop(conn, None)

    def idle(self, conn: Hashable) -> None:
        """Marks ``conn`` waiting for a request; one already idle keeps its place (sending header bytes buys no
        time)."""
        self._stalled.pop(conn, None)
        if conn in self._open and conn not in self._idle:
            self._idle[conn] = None

    def stalled(self, conn: Hashable) -> None:
        """Marks ``conn`` waiting for its client to read; one already stalled keeps its place (reading a few bytes
        of an answer buys no time)."""
        self._idle.pop(conn, None)
        if conn in self._open and conn not in self._stalled:
            self._stalled[conn] = None

    def closed(self, conn: Hashable) -> None:
        self._open.discard(conn)
        self._stalled.pop(conn, None)
        self._idle.pop(conn, None)

    def is_idle(self, conn: Hashable) -> bool:
        """Whether ``conn`` waits on its client (idle or stalled), so that the cap may shed it."""
        return conn in self._idle or conn in self._stalled


_books: weakref.WeakKeyDictionary[ServerState, ConnectionBook] = weakref.WeakKeyDictionary()


def _book_of(server_state: ServerState, cap: int) -> ConnectionBook:
    """One book per uvicorn server (its connections share the ``ServerState``)."""
    book = _books.get(server_state)
    if book is None:
        book = _books[server_state] = ConnectionBook(cap)
    return book


class BoundedH11Protocol(ProblemBadRequest, H11Protocol):  # a request h11 refuses: a problem+json 400
    """uvicorn's h11 protocol with header and write deadlines, bounded pipelining and the per-process cap (see the
    module docstring)."""

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
        self._write_timer: asyncio.TimerHandle | None = None
        self._pipelined = 0  # requests in a row that were waiting when the previous answer completed
        self._next_waits_for_drain = False  # an answer completed while bytes of it were unsent
        self._shed = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=0)  # pause on the first byte left unsent, resume on the last
        sock = transport.get_extra_info("socket")
        if self.limits.send_buffer_bytes and sock is not None:  # else loopback autotunes it to 4 MiB
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)
        victim = self.book.opened(self)
        if isinstance(victim, BoundedH11Protocol):
            victim.shed("refused" if victim is self else "evicted")
        self._track()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._track()

    def on_response_complete(self) -> None:
        if self.flow.write_paused:  # the next request waits until this answer has left: one answer in memory
            self._next_waits_for_drain = True
            self._track()
            return
        self._next_request()

    def _next_request(self) -> None:
        """uvicorn's end of an answer (keep-alive clock, reading resumed), then the next request if it is here."""
        answered = self.cycle
        super().on_response_complete()
        if self.cycle is not answered:
            self._pipelined += 1
            if self._pipelined >= self.limits.max_pipelined_requests:
                self.cycle.keep_alive = False  # uvicorn closes after this answer; what else was sent is dropped
        else:
            self._pipelined = 0
        self._track()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_late)
        self._track()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stop_clock("_write_timer")
        if self._next_waits_for_drain:
            self._next_waits_for_drain = False
            self._next_request()
        else:
            self._track()

    def shutdown(self) -> None:
        """uvicorn's graceful close, except that a connection between requests with an answer still unsent is
        reset: closing it would hold the shutdown until the client reads."""
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.flow.write_paused and not answering:
            self.shed("shutdown")
        else:
            super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clocks()
        self.book.closed(self)
        super().connection_lost(exc)

    def shed(self, reason: str) -> None:
        """Resets the connection to keep a limit: its descriptor and buffers go now, whatever it had left to send.
        Counted once under ``reason`` (never logged)."""
        self._stop_clocks()
        self.book.closed(self)
        if self._shed:
            return
        self._shed = True
        counter = self.app_state.get(CLOSED_CONNECTIONS)
        if counter is not None:
            counter.labels(reason).inc()
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # already gone: abort closes what is left
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
        self.transport.abort()

    def _track(self) -> None:
        """Stalled (an answer unsent) and idle (no request in progress) connections wait on their client and may be
        shed; one whose request is being served may not. The header clock runs while the connection waits for a
        request with nothing left to send (the write clock runs while something is)."""
        if self._shed:
            return
        answering = self.cycle is not None and not self.cycle.response_complete
        if self.flow.write_paused:
            self.book.stalled(self)
        elif answering and not self.transport.is_closing():
            self.book.busy(self)
        else:
            self.book.idle(self)
        if answering or self.flow.write_paused:
            self._stop_clock("_header_timer")
        elif self._header_timer is None:
            self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self.shed, "header_timeout")

    def _write_late(self) -> None:
        self._write_timer = None
        self.shed("write_timeout")

    def _stop_clocks(self) -> None:
        self._stop_clock("_header_timer")
        self._stop_clock("_write_timer")

    def _stop_clock(self, name: str) -> None:
        timer: asyncio.TimerHandle | None = getattr(self, name)
        if timer is not None:
            timer.cancel()
            setattr(self, name, None)
