"""Connection limits: the book's choice of what to close, the cap under the fd limit, and uvicorn serving with them.

The served tests run uvicorn in a thread with ``ServeConfig`` and a tiny app, over raw loopback sockets; every
wait is bounded (``WAIT_S`` is an upper bound for something to happen, never a measured duration).
"""

from __future__ import annotations

import resource
import select
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from strata.api.connections import (
    ACCEPT_PASSES,
    BACKLOG,
    CLOSED_CONNECTIONS,
    FD_RESERVE,
    ConnectionBook,
    ConnectionLimits,
    ServeConfig,
    connection_cap,
    raise_open_file_limit,
)
from strata.api.metrics import Metrics
from strata.config import ApiSettings
from tests.support.processes import free_port, wait_for

WAIT_S = 20.0  # an upper bound for the server to act


# --- the book: which connection goes when the cap is reached ---------------------------------------------


def test_at_the_cap_the_longest_idle_connection_is_closed_first() -> None:
    book = ConnectionBook(cap=3)
    for conn in ("a", "b", "c"):
        assert book.opened(conn) is None
    book.busy("a")
    book.busy("b")
    book.idle("a")  # fell idle after "c": "c" has been idle longest
    assert book.opened("d") == "c" and len(book) == 3
    assert book.opened("e") == "a" and not book.is_idle("a")


def test_sending_bytes_while_idle_keeps_a_connections_place_in_line() -> None:
    book = ConnectionBook(cap=2)
    book.opened("slow")
    book.opened("quick")
    book.idle("slow")  # more header bytes: still the longest idle
    assert book.opened("new") == "slow"


def test_when_every_other_connection_has_a_request_running_the_new_one_is_refused() -> None:
    book = ConnectionBook(cap=2)
    for conn in ("a", "b"):
        book.opened(conn)
        book.busy(conn)
    assert book.opened("c") == "c" and len(book) == 2
    book.closed("a")
    assert book.opened("d") is None


def test_a_closed_connection_is_never_chosen_twice() -> None:
    book = ConnectionBook(cap=1)
    book.opened("a")
    assert book.opened("b") == "a"
    book.idle("a")  # a late event from the connection being closed
    assert book.opened("c") == "b"


@pytest.mark.parametrize(
    ("wanted", "fd_limit", "cap"),
    [
        (1000, 20000, 1000),
        (1000, 1024, 1024 - FD_RESERVE - ACCEPT_PASSES * BACKLOG),
        (100, 1024, 100),
        (1000, 300, 1),
    ],
)
def test_the_cap_leaves_room_for_the_engine_and_accepts_in_flight(wanted: int, fd_limit: int, cap: int) -> None:
    assert connection_cap(wanted, fd_limit) == cap
    limits = ConnectionLimits.for_process(ApiSettings(max_connections=wanted), fd_limit)
    assert limits.max_connections == cap


def test_the_soft_open_file_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    lowered = min(soft, 512)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowered, hard))
    try:
        raised = raise_open_file_limit()
        now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        assert raised == now and (now == hard or hard == resource.RLIM_INFINITY) and now >= lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]), hard))


# --- served: uvicorn with ServeConfig --------------------------------------------------------------------


def closed_by_server(sock: socket.socket, wait_s: float = WAIT_S) -> bool:
    try:
        return bool(select.select([sock], [], [], wait_s)[0]) and sock.recv(65536) == b""
    except ConnectionResetError:
        return True


def connect_refused(port: int) -> bool:
    """Connects and reports whether the server closed the connection, however early its reset arrives.

    A socket with a timeout connects without blocking and reads the outcome afterwards, so a server that accepts
    and aborts at once can make ``connect`` itself raise ``ConnectionResetError``: that is a refusal too.
    """
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    except ConnectionResetError:
        return True
    with sock:
        return closed_by_server(sock)


def still_open(sock: socket.socket) -> bool:
    return not select.select([sock], [], [], 0)[0]


def request(port: int, path: str, sock: socket.socket | None = None) -> tuple[socket.socket, int]:
    """Sends ``GET path`` (on ``sock`` or a new connection) and reads the status of its answer."""
    sock = sock or socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode("ascii"))
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(next((h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")), b"0"))
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return sock, int(head.split()[1])


class Served:
    """A tiny app under uvicorn with ``ServeConfig``: ``/ping`` answers, ``/hold`` waits for ``release``."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.metrics = Metrics()
        self.release, self.held = threading.Event(), 0
        self.port = free_port()
        config = ServeConfig(self._app(), limits=limits, host="127.0.0.1", port=self.port, log_config=None)
        self.server = uvicorn.Server(config)

    def _app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, object]]:
            yield {CLOSED_CONNECTIONS: self.metrics.connections_closed}

        app = FastAPI(lifespan=lifespan)
        app.add_api_route("/ping", lambda: {"ok": True})

        async def hold() -> dict[str, bool]:
            self.held += 1
            await run_in_threadpool(self.release.wait, WAIT_S)
            return {"ok": True}

        app.add_api_route("/hold", hold)
        return app

    def closed(self, reason: str) -> float:
        """The count of connections closed for ``reason``, as a scrape shows it."""
        wanted = f'strata_http_connections_closed_total{{reason="{reason}"}} '
        lines = [line for line in self.metrics.render().decode().splitlines() if line.startswith(wanted)]
        return float(lines[0].split()[-1]) if lines else 0.0


@contextmanager
def served(**limits: float) -> Iterator[Served]:
    given = {"header_timeout_s": 60.0, "keep_alive_s": 60.0, "max_connections": 100, **limits}
    service = Served(ConnectionLimits(**given))  # type: ignore[arg-type]
    thread = threading.Thread(target=service.server.run, daemon=True)
    thread.start()
    try:
        assert (
            wait_for(lambda: service.server.started or not thread.is_alive(), within_s=WAIT_S)
            and service.server.started
        )
        yield service
    finally:
        service.release.set()
        service.server.should_exit = True
        thread.join(30)


@pytest.mark.integration
def test_at_the_cap_a_new_client_is_served_and_the_oldest_silent_connection_closed() -> None:
    with served(max_connections=4) as service:
        silent = [socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S) for _ in range(4)]
        sock, status = request(service.port, "/ping")
        assert status == 200
        assert closed_by_server(silent[0]) and all(still_open(s) for s in silent[1:])
        assert service.closed("evicted") == 1
        for s in (*silent, sock):
            s.close()


@pytest.mark.integration
def test_when_every_connection_has_a_request_running_a_new_one_is_closed_and_they_finish() -> None:
    with served(max_connections=2) as service:
        holders = [socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S) for _ in range(2)]
        for sock in holders:
            sock.sendall(b"GET /hold HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert wait_for(lambda: service.held == 2, within_s=WAIT_S)
        assert connect_refused(service.port)
        assert wait_for(lambda: service.closed("refused") == 1, within_s=WAIT_S)
        service.release.set()
        assert [request(service.port, "/ping", sock)[1] for sock in holders] == [200, 200]  # after their /hold
        for sock in holders:
            sock.close()


@pytest.mark.integration
def test_headers_not_complete_in_time_close_the_connection_however_slowly_they_trickle() -> None:
    with served(header_timeout_s=0.5) as service:
        silent = socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S)
        trickling = socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S)
        head = b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 2000
        sent = 0
        while still_open(trickling) and sent < len(head):  # one byte per 10 ms: 20 s to complete the headers
            try:
                trickling.sendall(head[sent : sent + 1])
            except OSError:  # closed between the check and the send
                break
            sent += 1
            select.select([trickling], [], [], 0.01)  # the sender's pace, not a wait for the server
        assert closed_by_server(trickling) and sent < len(head)
        assert closed_by_server(silent)
        assert service.closed("header_timeout") == 2


@pytest.mark.integration
def test_a_keep_alive_connection_is_closed_after_its_idle_timeout_and_serves_until_then() -> None:
    with served(keep_alive_s=0.5, header_timeout_s=60.0) as service:
        sock, first = request(service.port, "/ping")
        _, second = request(service.port, "/ping", sock)
        assert (first, second) == (200, 200)
        assert closed_by_server(sock)
