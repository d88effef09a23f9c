"""Every state a connection can be in has a bound: the matrix of ``api/connections.py``'s limits.

A client can leave a connection idle before its request, trickle its headers, trickle its body, pipeline
requests and never read the answers, read them slowly, or half-close after pipelining. For each state this
module checks that the server lets go of the connection within that state's deadline, its descriptor and buffers
included (uvicorn's own set of connections empties, which happens only once the socket is closed), and what the
cap does with it: a state that waits on its client is shed for a newcomer, one whose request is being served is
not. A new state joins ``STATES``.

uvicorn runs in a thread with ``ServeConfig`` and a tiny app (``/ping``, ``/big``: an answer far larger than
the kernel's buffers, ``/echo``: reads a body under strata's ``BodyLimit``), over raw loopback sockets; every
wait is bounded (``WAIT_S`` is an upper bound for the server to act, never a measured duration), and a slow
client's pace is the attack, not a synchronisation.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import Response

from strata.api.connections import ConnectionBook, ConnectionLimits
from strata.api.middleware import BodyLimit
from strata.config import ApiSettings
from tests.api.test_connections import WAIT_S, Served, request
from tests.support.processes import wait_for

pytestmark = pytest.mark.integration

BIG = 8 * 1024 * 1024  # larger than what the kernel's send and receive buffers hold together (tcp_wmem max: 4 MiB)
DEADLINE_S = 0.5  # each state's deadline in the deadline tests
BODY_LENGTH = 4096
ANSWER = 50_000  # about /openapi.json's size


class SlowReaderApp(Served):
    """``Served``'s app with ``/big`` (``BIG`` bytes) and ``/echo`` (a body read under ``BodyLimit``)."""

    def __init__(self, limits: ConnectionLimits, body_timeout_s: float) -> None:
        self.body_timeout_s = body_timeout_s
        self.answered = 0  # requests for /answer the app has answered
        super().__init__(limits)

    def _app(self) -> FastAPI:
        app = super()._app()
        big, answer = b"x" * BIG, b"a" * ANSWER
        app.add_api_route("/big", lambda: Response(big, media_type="application/octet-stream"))

        def counted() -> Response:
            self.answered += 1
            return Response(answer, media_type="application/octet-stream")

        app.add_api_route("/answer", counted)

        async def echo(req: Request) -> dict[str, int]:
            return {"bytes": len(await req.body())}

        app.add_api_route("/echo", echo, methods=["POST"])
        app.add_middleware(BodyLimit, max_bytes=1 << 20, timeout_s=self.body_timeout_s, metrics=self.metrics)
        return app

    def connections(self) -> int:
        """Connections uvicorn still holds: one leaves this set only once its socket is closed."""
        return len(self.server.server_state.connections)


@contextmanager
def serving(*, body_timeout_s: float = 60.0, **limits: float) -> Iterator[SlowReaderApp]:
    """``SlowReaderApp`` under uvicorn in a thread; every deadline 60 s unless ``limits`` say otherwise."""
    given = {"header_timeout_s": 60.0, "keep_alive_s": 60.0, "write_timeout_s": 60.0, "max_connections": 100}
    service = SlowReaderApp(ConnectionLimits(**{**given, **limits}), body_timeout_s)  # type: ignore[arg-type]
    thread = threading.Thread(target=service.server.run, daemon=True)
    thread.start()
    try:
        assert wait_for(lambda: service.server.started or not thread.is_alive(), within_s=WAIT_S)
        assert service.server.started
        yield service
    finally:
        service.release.set()
        service.server.should_exit = True
        thread.join(30)


# --- the states: each puts a new connection in its state and keeps it there while ``keep`` is called ---------


def connect(port: int, *, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer:  # before connect, so that the window the server sees is small from the start
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", port))
    return sock


def pipelined(path: str, count: int) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode("ascii") * count


@dataclass
class Client:
    """One connection in a state, and what the client does on each round to stay in it."""

    sock: socket.socket
    step: Callable[[], None] = lambda: None
    received: int = 0

    def keep(self) -> None:
        with contextlib.suppress(OSError):  # the server has reset it
            self.step()


def idle_before_request(port: int) -> Client:
    return Client(connect(port))


def trickling_headers(port: int) -> Client:
    client = Client(connect(port))
    client.sock.sendall(b"GET /ping HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    client.step = lambda: client.sock.sendall(b"X-Slow: a\r\n")
    return client


def trickling_body(port: int) -> Client:
    client = Client(connect(port))
    head = f"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {BODY_LENGTH}\r\n\r\n{{"
    client.sock.sendall(head.encode("ascii"))
    client.step = lambda: client.sock.sendall(b" ")
    return client


def pipelining_not_reading(port: int) -> Client:
    client = Client(connect(port, receive_buffer=1024))
    client.sock.sendall(pipelined("/big", 8))
    return client


def reading_slowly(port: int) -> Client:
    client = Client(connect(port, receive_buffer=1024))
    client.sock.sendall(pipelined("/big", 1))

    def read_a_little() -> None:
        if select.select([client.sock], [], [], 0)[0]:
            client.received += len(client.sock.recv(1024))

    client.step = read_a_little
    return client


def half_closed(port: int) -> Client:
    client = Client(connect(port, receive_buffer=1024))
    client.sock.sendall(pipelined("/big", 8))
    client.sock.shutdown(socket.SHUT_WR)
    return client


@dataclass(frozen=True)
class State:
    enter: Callable[[int], Client]
    deadline: str  # the limit that ends it (a ConnectionLimits field, or BodyLimit's timeout for a body)
    waits_on_client: bool  # shed for a newcomer at the cap (else the newcomer is refused)


STATES = {
    "idle before request": State(idle_before_request, "header_timeout_s", waits_on_client=True),
    "mid-headers trickle": State(trickling_headers, "header_timeout_s", waits_on_client=True),
    # a request being served (its body read by the app) holds its place; BodyLimit's 408 ends it, and an
    # unauthenticated one is refused from its headers (tests/api/test_hostile_clients.py)
    "mid-body trickle": State(trickling_body, "body_timeout_s", waits_on_client=False),
    "pipelined, not reading": State(pipelining_not_reading, "write_timeout_s", waits_on_client=True),
    "reading slowly": State(reading_slowly, "write_timeout_s", waits_on_client=True),
    "half-closed after pipelining": State(half_closed, "write_timeout_s", waits_on_client=True),
}


def settled(service: SlowReaderApp, clients: list[Client], condition: Callable[[], bool]) -> bool:
    """Keeps ``clients`` in their states (one step per 20 ms) until ``condition`` holds or ``WAIT_S`` passes."""

    def step() -> bool:
        for client in clients:
            client.keep()
        select.select([], [], [], 0.02)  # the clients' pace
        return condition()

    return wait_for(step, within_s=WAIT_S)


def reset_or_closed(sock: socket.socket) -> bool:
    """Whether the server has let go of ``sock`` (reset, or closed after what it sent); reads what is left."""
    try:
        while select.select([sock], [], [], 0)[0]:
            if not sock.recv(1 << 20):
                return True
    except OSError:  # ConnectionResetError: shed
        return True
    return False


@pytest.mark.parametrize("name", STATES)
def test_every_connection_state_ends_within_its_deadline(name: str) -> None:
    state = STATES[name]
    with serving(**{state.deadline: DEADLINE_S}) as service:  # every other deadline 60 s: this one must end it
        client = state.enter(service.port)
        assert settled(service, [client], lambda: service.connections() == 0), f"{name}: still held"
        assert reset_or_closed(client.sock)
        assert client.received < BIG
        _, status = request(service.port, "/ping")
        assert status == 200
        client.sock.close()


# --- the cap: what waits on its client is shed for a newcomer, in the order it began to wait ---------------


@pytest.mark.parametrize("name", STATES)
def test_at_the_cap_a_connection_waiting_on_its_client_is_shed_and_one_being_served_is_not(name: str) -> None:
    state, cap = STATES[name], 3
    with serving(max_connections=cap) as service:
        first = []
        for n in range(cap):  # one at a time, so that the order they began to wait is theirs
            first.append(state.enter(service.port))
            assert settled(service, first, lambda n=n: in_state(service, n + 1, state)), f"{name}: not reached"
        entered = [newcomer(state, service.port) for _ in range(cap)]
        later = [client for client in entered if client is not None]
        clients = first + later
        assert settled(service, clients, lambda: service.connections() == cap)
        if state.waits_on_client:  # the newcomers took the places of the ones that waited longest
            assert len(later) == cap, "a newcomer was refused while a place waited on its client"
            assert settled(service, clients, lambda: all(reset_or_closed(c.sock) for c in first))
            assert not any(reset_or_closed(c.sock) for c in later)
            assert service.closed("evicted") == cap
        else:  # every place holds a request being served: the newcomers were refused
            assert settled(service, clients, lambda: all(reset_or_closed(c.sock) for c in later))
            assert not any(reset_or_closed(c.sock) for c in first)
            assert wait_for(lambda: service.closed("refused") == cap, within_s=WAIT_S)
        for client in clients:
            client.sock.close()


def newcomer(state: State, port: int) -> Client | None:
    """A new connection entering ``state``; None when the server reset it before it got there (a refusal
    can arrive while ``connect`` or the first ``sendall`` is still running)."""
    try:
        return state.enter(port)
    except (ConnectionResetError, BrokenPipeError):
        return None


def in_state(service: SlowReaderApp, count: int, state: State) -> bool:
    """Whether the server holds ``count`` connections, each in ``state`` as the server sees it."""
    conns = list(service.server.server_state.connections)
    if state.deadline == "write_timeout_s":
        reached = [conn.flow.write_paused for conn in conns]  # an answer waits for the client to read it
    elif state.deadline == "body_timeout_s":
        reached = [conn.cycle is not None for conn in conns]  # a request being served
    else:
        reached = [True for _ in conns]
    return len(conns) == count and all(reached)


# --- pipelining and shutdown ------------------------------------------------------------------------------


def answers_until_closed(sock: socket.socket) -> int:
    """How many answers arrive on ``sock`` before the server closes it (fails if it stays open ``WAIT_S``)."""
    data = b""
    while select.select([sock], [], [], WAIT_S)[0] and (chunk := sock.recv(65536)):
        data += chunk
    assert select.select([sock], [], [], 0)[0], "the server kept the connection open"
    return data.count(b"HTTP/1.1 200 ")


def test_a_client_pipelining_more_than_the_bound_gets_that_many_answers_then_the_connection_closes() -> None:
    with serving(max_pipelined_requests=2) as service:
        sock = connect(service.port)
        sock.sendall(pipelined("/ping", 6))
        assert answers_until_closed(sock) == 3  # the first, then two sent before their previous answer was read
        sock.close()
        sock = connect(service.port)  # a client that waits for each answer is never cut off
        for _ in range(6):
            assert request(service.port, "/ping", sock)[1] == 200
        sock.close()


def test_a_client_reading_a_long_answer_is_bounded_by_the_write_deadline_not_the_header_deadline() -> None:
    with serving(header_timeout_s=DEADLINE_S, keep_alive_s=DEADLINE_S) as service:  # write deadline: 60 s
        client = Client(connect(service.port, receive_buffer=65536))
        client.sock.sendall(pipelined("/big", 1))

        def read_some() -> None:  # 64 KiB per round: seconds for the whole answer, many header deadlines
            if select.select([client.sock], [], [], 0)[0]:
                client.received += len(client.sock.recv(65536))

        client.step = read_some
        assert settled(service, [client], lambda: client.received >= BIG), client.received
        assert service.closed("header_timeout") == 0
        client.sock.close()


@pytest.mark.parametrize("send_buffer", [65536, 16384])
def test_a_client_that_pipelines_and_never_reads_costs_what_its_buffers_hold_not_what_it_asked(
    send_buffer: int,
) -> None:
    with serving(send_buffer_bytes=send_buffer) as service:
        client = Client(connect(service.port, receive_buffer=1024))
        client.sock.sendall(pipelined("/answer", 8))
        assert settled(service, [client], lambda: in_state(service, 1, STATES["pipelined, not reading"]))
        # the kernel holds twice send_buffer at most, the process one answer: no request answered beyond that
        assert service.answered <= 2 + 2 * send_buffer // ANSWER < 8
        client.sock.close()


def test_shutdown_resets_a_connection_whose_answer_the_client_is_not_reading() -> None:
    with serving() as service:  # write deadline 60 s, no shutdown grace: only the reset lets the server stop
        client = Client(connect(service.port, receive_buffer=1024))
        client.sock.sendall(pipelined("/big", 1))  # answered in full into the buffer, never read
        assert settled(service, [client], lambda: in_state(service, 1, STATES["reading slowly"]))
        service.server.should_exit = True
        assert settled(service, [client], lambda: service.connections() == 0)
        assert service.closed("shutdown") == 1
        client.sock.close()


# --- the book's order: stalled before idle -----------------------------------------------------------------


def test_at_the_cap_a_stalled_connection_goes_before_an_idle_one_even_one_idle_longer() -> None:
    book = ConnectionBook(cap=3)
    for conn in ("new-client", "reader-1", "reader-2"):
        book.opened(conn)
    book.busy("reader-1")
    book.busy("reader-2")
    book.stalled("reader-1")  # its answer is unsent: the client is not reading
    book.stalled("reader-2")
    assert book.opened("another") == "reader-1"  # not "new-client", idle (its request unread) since before
    book.stalled("reader-2")  # reading a few bytes keeps its place
    book.idle("reader-2")  # its answer left: now it waits for a request, behind the idle ones
    assert book.opened("third") == "new-client"
    assert book.opened("fourth") == "another"


def test_a_connection_being_served_is_never_shed_for_a_newcomer() -> None:
    book = ConnectionBook(cap=1)
    book.opened("served")
    book.busy("served")
    book.stalled("served")
    book.busy("served")  # its answer left while it was still being served
    assert book.opened("newcomer") == "newcomer" and not book.is_idle("served")


def test_the_limits_a_test_leaves_out_are_the_settings_defaults() -> None:
    api = ApiSettings()
    given = ConnectionLimits(header_timeout_s=api.header_timeout_s, keep_alive_s=api.keep_alive_s, max_connections=1)
    assert ConnectionLimits.for_process(api, fd_limit=1 << 20) == replace(given, max_connections=api.max_connections)
