"""Tenants stay apart and no client can stall the service.

Slow senders talk raw HTTP/1.1 over loopback sockets to uvicorn serving the
app in a thread; every wait is bounded (``WAIT_S`` is an upper bound for an
answer to arrive, never a measured duration). Metrics, upload names and key
checks go through the FastAPI test client.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from pydantic import SecretStr

from strata.api import create_app
from strata.config import ApiKeyGrant, ConfigError, Settings
from strata.resources import Resources
from tests.support.api import KEYS, AppFactory, auth
from tests.support.processes import free_port, run_strata, strata_env

WAIT_S = 20.0  # an upper bound for an answer to arrive
READER = "demo-reader-key"
METRICS_KEY = "prometheus-scrape-key-0123"
FULL_ACCESS_KEY = "the-full-access-key-0123456789"
RETRIEVE = {"query": "password reset link", "top_k": 1}


def wait_until(condition: Callable[[], bool], bound_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + bound_s
    while not condition() and time.monotonic() < deadline:
        threading.Event().wait(0.02)
    return condition()


@pytest.fixture
def serve(stores: tuple[Settings, Resources]) -> Iterator[Callable[..., int]]:
    """Starts the app (the test keys, ``api`` overrides) under uvicorn on a free loopback port; returns the port."""
    settings, resources = stores
    running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(**api: Any) -> int:
        grants = {k: ApiKeyGrant(**v) for k, v in KEYS.items()}
        changed = settings.model_copy(update={"api": settings.api.model_copy(update={"keys": grants, **api})})
        port = free_port()
        app = create_app(changed, resources=resources, warm_up=False)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        running.append((server, thread))
        assert wait_until(lambda: server.started or not thread.is_alive()) and server.started, "uvicorn did not start"
        return port

    yield start
    for server, thread in running:
        server.should_exit = True
        thread.join(30)


def send_head(
    port: int, method: str, path: str, *, length: int, key: str | None = None, content_type: str = "application/json"
) -> socket.socket:
    """A connection that has sent a request's headers (declaring ``length`` body bytes) and no body yet."""
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Content-Type: {content_type}",
        f"Content-Length: {length}",
    ]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
    return sock


def answered(sock: socket.socket, wait_s: float) -> bool:
    return bool(select.select([sock], [], [], wait_s)[0])


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Status, headers and JSON body of the answer on ``sock``; fails when none arrives within ``WAIT_S``."""
    assert answered(sock, WAIT_S), "no answer arrived while the request body was still incomplete"
    data = b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (h.partition(":") for h in header_lines)}
    while len(body) < int(headers.get("content-length", 0)) and (chunk := sock.recv(65536)):
        body += chunk
    return int(status_line.split()[1]), headers, json.loads(body or b"{}")


def trickle(socks: list[socket.socket], *, length: int) -> list[tuple[int, int]]:
    """Sends each socket's body one byte per round until the server answers; (status, bytes sent) per socket."""
    sent = [0] * len(socks)
    outcome: dict[int, tuple[int, int]] = {}
    for _ in range(2 * length):
        waiting = [i for i in range(len(socks)) if i not in outcome]
        if not waiting:
            break
        ready = select.select([socks[i] for i in waiting], [], [], 0.05)[0]
        for i in waiting:
            if socks[i] in ready:
                outcome[i] = (read_answer(socks[i])[0], sent[i])
            elif sent[i] < length:
                try:
                    socks[i].sendall(b" ")
                    sent[i] += 1
                except OSError:  # the server answered and closed between the select and the send
                    outcome[i] = (read_answer(socks[i])[0], sent[i])
    assert len(outcome) == len(socks), "a slow body was never answered"
    return [outcome[i] for i in range(len(socks))]


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return answered(sock, WAIT_S) and sock.recv(1) == b""
    except ConnectionResetError:  # closed while bytes we sent were still unread
        return True


# --- item 4: slow bodies without a key hold no slot; slow bodies with one time out ---------------------


def test_requests_without_a_key_are_refused_before_their_body_and_hold_no_slot(serve: Callable[..., int]) -> None:
    port = serve(max_concurrency=2, queue_timeout_s=0.2)
    http = f"http://127.0.0.1:{port}"
    for _ in range(3):  # each round: two slow senders without a key, then the key's retrieval
        slow = [send_head(port, "POST", "/retrieve", length=64) for _ in range(2)]
        for sock in slow:
            sock.sendall(b"{")
        for sock in slow:
            status, headers, problem = read_answer(sock)  # after 1 of 64 bytes
            assert status == 401 and problem["title"] == "Unauthorized" and headers["connection"] == "close"
            assert closed_by_server(sock)
        answer = httpx.post(f"{http}/retrieve", json=RETRIEVE, headers=auth(READER), timeout=WAIT_S)
        assert answer.status_code == 200, answer.text
        for sock in slow:
            sock.close()


def test_a_body_that_arrives_too_slowly_is_a_408_and_frees_its_slot(serve: Callable[..., int]) -> None:
    # one key may hold both slots here (by default it holds half): test_key_slots.py covers the share
    port = serve(max_concurrency=2, max_concurrency_per_key=2, queue_timeout_s=0.2, body_timeout_s=0.5)
    slow = [send_head(port, "POST", "/retrieve", length=200, key=READER) for _ in range(2)]
    outcomes = trickle(slow, length=200)
    assert all(status == 408 and sent < 200 for status, sent in outcomes), outcomes
    assert all(closed_by_server(sock) for sock in slow)
    answer = httpx.post(f"http://127.0.0.1:{port}/retrieve", json=RETRIEVE, headers=auth(READER), timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=auth("admin-key"), timeout=WAIT_S).text
    assert 'strata_http_requests_rejected_total{reason="body_timeout"} 2.0' in metrics


# --- item 9: an upload without a key is refused before its body is read ----------------------------------


def test_an_upload_without_a_key_is_refused_before_the_client_has_sent_it(serve: Callable[..., int]) -> None:
    port = serve()
    total = 19 * 1024 * 1024
    sock = send_head(
        port,
        "POST",
        "/kbs/garden-uploads/documents",
        length=total,
        content_type="multipart/form-data; boundary=strata-boundary",
    )
    first = b'--strata-boundary\r\nContent-Disposition: form-data; name="files"; filename="big.md"\r\n\r\n'
    sock.sendall(first + b"a" * 65536)
    status, headers, problem = read_answer(sock)  # 64 KiB of 19 MiB sent
    assert status == 401 and "Bearer" in problem["detail"] and headers["www-authenticate"].startswith("Bearer")
    sock.close()


# --- item 3: metrics need the metrics grant; no kb name in a label --------------------------------------


@pytest.fixture
def metered(make_client: AppFactory) -> TestClient:
    grants = {k: ApiKeyGrant(**v) for k, v in KEYS.items()}
    grants[METRICS_KEY] = ApiKeyGrant(kbs=[], metrics=True)
    return make_client(api={"keys": grants, "api_key": SecretStr(FULL_ACCESS_KEY)})


def test_a_tenant_key_cannot_read_the_metrics(client: TestClient) -> None:
    assert client.post("/retrieve", json=RETRIEVE, headers=auth(READER)).status_code == 200
    refused = client.get("/metrics", headers=auth(READER))
    assert refused.status_code == 403 and "metrics" in refused.json()["detail"]
    assert client.get("/metrics", headers=auth("garden-writer-key")).status_code == 403  # writes, but not every kb
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=auth("admin-key")).status_code == 200  # every kb and write: full access


def test_a_metrics_key_or_the_full_access_key_reads_the_metrics_and_nothing_else(metered: TestClient) -> None:
    for key in (METRICS_KEY, FULL_ACCESS_KEY):
        scraped = metered.get("/metrics", headers=auth(key))
        assert scraped.status_code == 200 and "strata_http_requests_total" in scraped.text
    assert metered.post("/retrieve", json=RETRIEVE, headers=auth(METRICS_KEY)).status_code == 404
    assert metered.get("/kbs", headers=auth(METRICS_KEY)).json()["kbs"] == []
    assert metered.get("/kbs/demo/documents", headers=auth(METRICS_KEY)).status_code == 404


def test_no_kb_name_appears_in_the_metrics(client: TestClient) -> None:
    for kb in ("acme-private", "demo"):
        client.get(f"/kbs/{kb}/documents", headers=auth(READER))
        client.get(f"/kbs/{kb}/stats", headers=auth(READER))
        client.post("/retrieve", json={**RETRIEVE, "kb_ids": [kb]}, headers=auth(READER))
        client.delete(f"/kbs/{kb}/documents/some/doc.md", headers=auth(READER))
    text = client.get("/metrics", headers=auth("admin-key")).text
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert not [line for line in series if "acme-private" in line or '"demo"' in line or "doc.md" in line]
    assert 'route="/kbs/{kb}/stats"' in text


# --- item 5: a made-up HTTP method adds no series --------------------------------------------------------


def test_unknown_http_methods_share_one_metric_label(client: TestClient) -> None:
    for method in ("ZZCARD1", "ZZCARD2", "PROPFIND"):
        assert client.request(method, "/retrieve", headers=auth(READER)).status_code == 405
    text = client.get("/metrics", headers=auth("admin-key")).text
    assert "ZZCARD" not in text and "PROPFIND" not in text
    assert 'strata_http_requests_total{method="other",route="other",status="405"} 3.0' in text


# --- item 8: upload names the file system cannot hold are a 422 naming the file --------------------------


@pytest.mark.parametrize(
    ("names", "named"),
    [
        (["a" * 253 + ".md"], "a" * 253 + ".md"),  # 256 bytes: one more than a file system holds...
        (["é" * 127 + ".md"], "é" * 127 + ".md"),  # ...in UTF-8 bytes (130 characters)
        (["notes/" + "b" * 300 + "/x.md"], "b" * 300),
        (["conf", "conf/x.md"], "'conf'"),
        (["conf/x.md", "conf"], "'conf'"),
        (["deep/conf/x.md", "deep/conf"], "deep/conf"),
    ],
)
def test_upload_names_a_file_system_cannot_hold_are_a_422_naming_the_file(
    client: TestClient, names: list[str], named: str
) -> None:
    files = [("files", (name, b"# Note\n\nShort text about soil.", "text/markdown")) for name in names]
    answer = client.post("/kbs/garden-uploads/documents", files=files, headers=auth("garden-writer-key"))
    assert answer.status_code == 422, answer.text
    assert named in answer.json()["detail"]


def test_a_name_of_255_bytes_is_accepted(client: TestClient) -> None:
    name = "c" * 252 + ".md"
    files = [("files", (name, b"# Note\n\nCompost warms the soil in spring.", "text/markdown"))]
    answer = client.post("/kbs/garden-uploads/documents?dry_run=true", files=files, headers=auth("garden-writer-key"))
    assert answer.status_code == 200, answer.text


# --- item 10: keys that could never match, short keys, keys defined twice -------------------------------


def build(stores: tuple[Settings, Resources], **api: Any) -> None:
    settings, resources = stores
    create_app(settings.model_copy(update={"api": settings.api.model_copy(update=api)}), resources=resources)


@pytest.mark.parametrize(
    ("api", "where", "secret"),
    [
        (
            {"keys": {"a-good-key-0123456789": ApiKeyGrant(kbs=["demo"]), "trailing-space-key ": ApiKeyGrant()}},
            "STRATA_API__KEYS key #2",
            "trailing-space-key",
        ),
        ({"keys": {"clé-secrète-0123456789": ApiKeyGrant(kbs=["demo"])}}, "STRATA_API__KEYS key #1", "secr"),
        ({"keys": {"": ApiKeyGrant(kbs=["demo"])}}, "STRATA_API__KEYS key #1", None),
        ({"api_key": SecretStr(" padded-full-access-key")}, "STRATA_API__API_KEY", "padded-full"),
        ({"api_key": SecretStr("tab\tinside-the-key-0123")}, "STRATA_API__API_KEY", "inside-the"),
    ],
)
def test_a_key_no_client_could_send_is_refused_by_position(
    stores: tuple[Settings, Resources], api: dict[str, Any], where: str, secret: str | None
) -> None:
    with pytest.raises(ConfigError) as refused:
        build(stores, **api)
    message = str(refused.value)
    assert where in message and ("never match" in message or "is empty" in message), message
    assert secret is None or secret not in message


def test_a_key_defined_twice_is_refused(stores: tuple[Settings, Resources], tmp_path: Path) -> None:
    shared = "shared-key-0123456789"
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"file-only-key-0123456789": {"kbs": ["demo"]}, shared: {"kbs": ["demo"]}}))
    both = r"STRATA_API__KEYS key #1 is the same key as STRATA_API__KEYS_FILE .* key #2"
    with pytest.raises(ConfigError, match=both):
        build(stores, keys_file=keys_file, keys={shared: ApiKeyGrant(kbs=["*"], write=True)})
    with pytest.raises(ConfigError, match="STRATA_API__API_KEY is the same key as STRATA_API__KEYS key #1") as twice:
        build(stores, keys={shared: ApiKeyGrant(kbs=["demo"])}, api_key=SecretStr(shared))
    assert shared not in str(twice.value)
    twice_in_file = f'{{"{shared}": {{"kbs": ["demo"]}}, "other-key-0123456789": {{}}, "{shared}": {{"kbs": ["*"]}}}}'
    keys_file.write_text(twice_in_file)
    with pytest.raises(ConfigError, match="key #3 is the same key as key #1") as in_file:
        build(stores, keys_file=keys_file)
    assert shared not in str(in_file.value)


def test_a_short_key_is_a_warning_naming_it_by_position(stores: tuple[Settings, Resources]) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    log = logging.getLogger("strata.api.auth")
    log.addHandler(handler)
    try:
        build(stores, keys={"long-enough-key-0123": ApiKeyGrant(), "abcde": ApiKeyGrant()}, api_key=SecretStr("12345"))
    finally:
        log.removeHandler(handler)
    warnings = [r.getMessage() for r in records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "STRATA_API__KEYS key #2 has 5 characters" in warnings[0]
    assert "STRATA_API__API_KEY has 5 characters" in warnings[1]
    assert not any("abcde" in w or "12345" in w for w in warnings)


@pytest.mark.slow
def test_serve_refuses_a_key_that_could_never_match(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data", STRATA_API__KEYS=json.dumps({"a-secret-with-a-space ": {"kbs": ["*"]}}))
    refused = run_strata(["serve"], env, timeout=120)
    assert refused.returncode == 2 and "STRATA_API__KEYS key #1" in refused.stderr, refused.stderr
    assert "a-secret-with" not in refused.stderr
