"""The slow-reader attack on a running ``strata serve``, with what the workers hold while it lasts.

Each attacking socket asks for a 1 KiB receive buffer before it connects, sends ``PIPELINED`` requests for
``/openapi.json`` (about 50 KB each) at once, and never reads. Meanwhile a prober asks ``/health`` and another
tenant's ``/retrieve`` on fresh connections, and a watcher samples each worker's descriptors
(``/proc/PID/fd``) and resident memory. Used by ``tests/api/test_slow_reader_attack.py`` and
``scripts/bench_slow_readers.py``; every wait is bounded.
"""

from __future__ import annotations

import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from tests.api.shared_service import TENANT_B_READ, SharedService, auth

PIPELINED = 8
RECEIVE_BUFFER = 1024
PROBE_EVERY_S = 0.25
SAMPLE_EVERY_S = 0.1
PROBE_TIMEOUT_S = 30.0  # an upper bound for an answer during the attack, not a latency target


BURST, HOLD = "while they connect", "while they are held"  # the attack's phases


@dataclass
class Probe:
    """Latencies (ms) of the answers of one kind of request, and the failures (status or error) seen, by the
    phase of the attack the request began in."""

    answered_ms: dict[str, list[float]] = field(default_factory=lambda: {BURST: [], HOLD: []})
    failures: dict[str, list[str]] = field(default_factory=lambda: {BURST: [], HOLD: []})

    def run(self, phase: str, call: Callable[[], httpx.Response]) -> None:
        started = time.perf_counter()
        try:
            answer = call()
        except httpx.HTTPError as exc:
            self.failures[phase].append(type(exc).__name__)
            return
        if answer.status_code != 200:
            self.failures[phase].append(str(answer.status_code))
        else:
            self.answered_ms[phase].append((time.perf_counter() - started) * 1000)


@dataclass
class AttackReport:
    sockets: int
    connect_failures: int
    peak_fds: dict[int, int]  # by worker pid
    peak_rss_mb: dict[int, float]
    idle_fds: dict[int, int]
    idle_rss_mb: dict[int, float]
    health: Probe
    retrieve: Probe


def workers_of(service: SharedService) -> list[psutil.Process]:
    """The worker processes of ``strata serve --workers N`` (its children that run uvicorn's spawn entry)."""
    children = psutil.Process(service.process.pid).children()
    return [child for child in children if "spawn_main" in " ".join(child.cmdline())]


def descriptors(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


@contextmanager
def open_files(wanted: int) -> Iterator[None]:
    """Room in this process for ``wanted`` descriptors (the soft limit raised toward the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < wanted:
        raise RuntimeError(f"this process may open {hard} files; the attack needs {wanted}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def slow_reader(port: int, request: bytes) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.settimeout(10.0)
    try:
        sock.connect(("127.0.0.1", port))
        sock.sendall(request * PIPELINED)
    except OSError:
        sock.close()
        raise
    return sock


def attack(service: SharedService, *, sockets: int, hold_s: float) -> AttackReport:
    """Opens ``sockets`` slow readers one after another (the burst), holds them ``hold_s`` more (the hold), then
    closes them."""
    workers = workers_of(service)
    assert workers, "no worker process found"
    idle_fds = {w.pid: descriptors(w.pid) for w in workers}
    idle_rss = {w.pid: w.memory_info().rss / 2**20 for w in workers}
    peak_fds, peak_rss = dict(idle_fds), dict(idle_rss)
    health, retrieve = Probe(), Probe()
    done, phase = threading.Event(), [BURST]

    def watch() -> None:
        while not done.wait(SAMPLE_EVERY_S):
            for worker in workers:
                peak_fds[worker.pid] = max(peak_fds[worker.pid], descriptors(worker.pid))
                peak_rss[worker.pid] = max(peak_rss[worker.pid], worker.memory_info().rss / 2**20)

    def probe(kind: Probe, call: Callable[[httpx.Client], httpx.Response]) -> None:
        with httpx.Client(base_url=service.url, timeout=PROBE_TIMEOUT_S) as client:  # a new connection each
            kind.run(phase[0], lambda: call(client))

    def ask_health(client: httpx.Client) -> httpx.Response:
        return client.get("/health")

    def ask_retrieve(client: httpx.Client) -> httpx.Response:
        body = {"query": "sourdough starter", "top_k": 3, "kb_ids": ["beta"]}
        return client.post("/retrieve", json=body, headers=auth(TENANT_B_READ))

    def probes() -> None:  # open loop: a slow answer does not delay the next probe
        rounds = 0
        while not done.wait(PROBE_EVERY_S):
            kinds = [(health, ask_health)] + ([(retrieve, ask_retrieve)] if rounds % 4 == 0 else [])
            for kind, call in kinds:
                asked.append(threading.Thread(target=probe, args=(kind, call), daemon=True))
                asked[-1].start()
            rounds += 1

    asked: list[threading.Thread] = []
    threads = [threading.Thread(target=watch, daemon=True), threading.Thread(target=probes, daemon=True)]
    request = f"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1:{service.port}\r\n\r\n".encode("ascii")
    held: list[socket.socket] = []
    failures = 0
    for thread in threads:
        thread.start()
    try:
        while len(held) < sockets and failures < sockets:  # a connect that times out is tried again
            try:
                held.append(slow_reader(service.port, request))
            except OSError:
                failures += 1
        phase[0] = HOLD
        done.wait(hold_s)
    finally:
        done.set()
        for thread in threads + asked:
            thread.join(PROBE_TIMEOUT_S * 2)
        for sock in held:
            sock.close()
    return AttackReport(len(held), failures, peak_fds, peak_rss, idle_fds, idle_rss, health, retrieve)
