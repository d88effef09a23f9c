"""No client can freeze or starve the shared service, attacked as a tenant would on ``strata serve
--workers 2``: one read key trickling request bodies, a thousand idle sockets, a connection that never sends
its headers.

Every wait is bounded and waits for a condition (``WAIT_S`` is an upper bound for the service to act, never a
measured duration); the attacker's pace (a byte per round) is the attack, not a synchronisation.
"""

from __future__ import annotations

import re
import resource
import select
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.api.shared_service import METRICS, TENANT_A_READ, TENANT_B_READ, SharedService, auth, shared_service
from tests.support.processes import wait_for
from tests.support.stores import fresh_pg_database

pytestmark = pytest.mark.cost(30)

WAIT_S = 60.0  # an upper bound for the service to act
BODY_TIMEOUT_S = 4  # the service's, so that the attack's slot holders time out while the test runs
HEADER_TIMEOUT_S = 2
IDLE_SOCKETS, HALF_HEADERS, MAX_CONNECTIONS = 1_000, 100, 300  # per worker: 2 x 300 < 1,100
LOG_BOUND = 200 * 1024


def retrieve_b(url: str) -> httpx.Response:
    """Tenant B's retrieval on a connection of its own (a new client, as at the attack's height)."""
    body = {"query": "sourdough starter", "top_k": 3, "kb_ids": ["beta"]}
    with httpx.Client(base_url=url, timeout=httpx.Timeout(120.0, connect=10.0)) as client:
        return client.post("/retrieve", json=body, headers=auth(TENANT_B_READ))


def closed_by_server(sock: socket.socket, wait_s: float) -> bool:
    try:
        return bool(select.select([sock], [], [], wait_s)[0]) and sock.recv(65536) == b""
    except ConnectionResetError:
        return True


class TricklingTenant:
    """Tenant A's read key keeping ``size`` ``/retrieve`` requests open, each sending its body a byte per round;
    an answered one is replaced at once, as a determined attacker would."""

    def __init__(self, port: int, size: int = 20, length: int = 400) -> None:
        self.port, self.size, self.length = port, size, length
        self.statuses: list[int] = []
        self.stop = threading.Event()
        self._open: dict[socket.socket, int] = {}
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._open)

    def answered(self, status: int) -> int:
        with self._lock:
            return self.statuses.count(status)

    def _connect(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)
        head = (
            f"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {self.length}\r\nAuthorization: Bearer {TENANT_A_READ}\r\n\r\n{{"
        )
        sock.sendall(head.encode("ascii"))
        self._open[sock] = 1

    def _run(self) -> None:
        with self._lock:
            for _ in range(self.size):
                self._connect()
        while not self.stop.is_set():
            ready = select.select(list(self._open), [], [], 0.2)[0]  # one round: the attacker's pace
            with self._lock:
                for sock in ready:
                    self.statuses.append(_status(sock))
                    del self._open[sock]
                    sock.close()
                    self._connect()
                for sock, sent in list(self._open.items()):
                    if sent < self.length - 1:
                        try:
                            sock.sendall(b" ")
                            self._open[sock] = sent + 1
                        except OSError:  # answered and closed since the select: read next round
                            pass
        for sock in self._open:
            sock.close()


def _status(sock: socket.socket) -> int:
    try:
        head = sock.recv(65536)
    except ConnectionResetError:
        return 0
    match = re.match(rb"HTTP/1\.1 (\d{3})", head)
    return int(match.group(1)) if match else 0


@pytest.fixture(scope="module")
def slow_clients_service(
    tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str, module_pg_url: str
) -> Iterator[SharedService]:
    with shared_service(
        tmp_path_factory.mktemp("fair"),
        milvus_server_uri,
        module_pg_url,
        STRATA_API__BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        STRATA_API__HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
    ) as service:
        yield service


def test_one_key_trickling_bodies_never_starves_another_tenant(slow_clients_service: SharedService) -> None:
    service = slow_clients_service
    attack = TricklingTenant(service.port)
    attack.thread.start()
    answers_b: list[tuple[int, int]] = []  # (status, A's requests in flight when B asked)
    try:
        assert wait_for(lambda: attack.in_flight == attack.size, within_s=WAIT_S)
        # B asks again each time the attack has had answers, until A's slot holders have timed out on both
        # workers (4 slots each): B is served while A's requests hold, queue, time out and come back.
        while len(answers_b) < 8 or attack.answered(408) < 8:
            assert len(answers_b) < 40, f"the attack got {attack.statuses} while B asked {len(answers_b)} times"
            in_flight, seen = attack.in_flight, len(attack.statuses)
            answers_b.append((retrieve_b(service.url).status_code, in_flight))
            assert wait_for(lambda seen=seen: len(attack.statuses) > seen, within_s=WAIT_S), (
                "the attack's requests were never answered"
            )
    finally:
        attack.stop.set()
        attack.thread.join(WAIT_S)
    assert all(status == 200 for status, _ in answers_b), answers_b
    assert min(in_flight for _, in_flight in answers_b) >= attack.size // 2, answers_b  # B asked during the attack
    # A's bodies never complete: its requests over the key's share wait and get a 503, and those holding a slot
    # lose it at the body timeout (408); none is answered otherwise
    assert set(attack.statuses) <= {408, 503} and attack.answered(503) > 0, attack.statuses


def test_a_connection_that_never_completes_its_headers_is_closed(slow_clients_service: SharedService) -> None:
    service = slow_clients_service
    silent = socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S)
    half = socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S)
    half.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Never-Ends: ")
    try:
        assert closed_by_server(silent, WAIT_S) and closed_by_server(half, WAIT_S)
        assert service.http.get("/health").status_code == 200
    finally:
        silent.close()
        half.close()


# --- a thousand idle sockets ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def capped_service(tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str) -> Iterator[SharedService]:
    """Idle sockets are shed by the cap alone here: the header timeout outlasts the test. (A database of its
    own: the seeded kbs of ``slow_clients_service`` live in another collection.)"""
    with (
        fresh_pg_database() as pg_url,
        shared_service(
            tmp_path_factory.mktemp("capped"),
            milvus_server_uri,
            pg_url,
            STRATA_API__MAX_CONNECTIONS=str(MAX_CONNECTIONS),
            STRATA_API__HEADER_TIMEOUT_S="600",
        ) as service,
    ):
        yield service


@pytest.fixture
def many_files() -> Iterator[None]:
    """Room in this process for the attack's sockets (the soft limit raised toward the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4 * (IDLE_SOCKETS + HALF_HEADERS)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"this process may open {hard} files; the attack needs {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_thousand_idle_sockets_neither_block_the_service_nor_flood_its_log(
    capped_service: SharedService, many_files: None
) -> None:
    service = capped_service
    service.http.close()  # its pooled connection would be one more to shed, muddying the count below
    log_before = service.log.stat().st_size
    socks = [socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S) for _ in range(IDLE_SOCKETS)]
    for _ in range(HALF_HEADERS):
        sock = socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S)
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ")
        socks.append(sock)
    poller, closed = select.poll(), set[int]()
    for sock in socks:
        poller.register(sock, select.POLLIN)

    def shed() -> int:  # how many of the attack's sockets the service has closed so far
        closed.update(fd for fd, _ in poller.poll(0))
        return len(closed)

    try:
        with httpx.Client(base_url=service.url, timeout=httpx.Timeout(120.0, connect=10.0)) as client:
            assert client.get("/health").status_code == 200
        answer = retrieve_b(service.url)
        assert answer.status_code == 200, answer.text
        assert {doc["metadata"]["kb_id"] for doc in answer.json()["docs"]} == {"beta"}
        # each worker keeps at most MAX_CONNECTIONS open: the longest idle of the attack's went first
        assert wait_for(lambda: shed() >= IDLE_SOCKETS + HALF_HEADERS - 2 * MAX_CONNECTIONS, within_s=WAIT_S), shed()
        # counted once each: the scrape (whose own connection may shed one more) first, then what the client saw
        assert wait_for(lambda: _closed_for_room(service) == shed(), within_s=WAIT_S), (
            shed(),
            _closed_for_room(service),
        )
    finally:
        for sock in socks:
            sock.close()
    log = service.log_text()
    assert "Too many open files" not in log and "out of system resource" not in log
    assert service.log.stat().st_size - log_before < LOG_BOUND, log[-3000:]


def _closed_for_room(service: SharedService) -> int:
    """Connections the service closed to make room, counted once each over both workers (``/metrics``)."""
    with httpx.Client(base_url=service.url, timeout=httpx.Timeout(120.0, connect=10.0)) as client:
        text = client.get("/metrics", headers=auth(METRICS)).text
    counts = re.findall(r'^strata_http_connections_closed_total\{reason="(?:evicted|refused)"\} (\S+)$', text, re.M)
    return int(sum(float(count) for count in counts))


def test_trickling_bodies_and_idle_sockets_at_once_leave_another_tenant_served(
    capped_service: SharedService, many_files: None
) -> None:
    """Both attacks of one tenant together: 20 of A's requests trickling their bodies and 1,100 idle sockets
    (100 with half-sent headers) open; B's ``/retrieve`` answers 200 each time it asks."""
    service = capped_service
    attack = TricklingTenant(service.port)
    attack.thread.start()
    socks: list[socket.socket] = []
    try:
        assert wait_for(lambda: attack.in_flight == attack.size, within_s=WAIT_S)
        socks = [socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S) for _ in range(IDLE_SOCKETS)]
        for _ in range(HALF_HEADERS):
            sock = socket.create_connection(("127.0.0.1", service.port), timeout=WAIT_S)
            sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ")
            socks.append(sock)
        answers = [(retrieve_b(service.url).status_code, attack.in_flight) for _ in range(3)]
    finally:
        attack.stop.set()
        attack.thread.join(WAIT_S)
        for sock in socks:
            sock.close()
    assert [status for status, _ in answers] == [200, 200, 200], answers
    assert min(in_flight for _, in_flight in answers) >= attack.size // 2, answers  # asked during the attack
