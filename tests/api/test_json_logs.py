"""``STRATA_LOG__FORMAT=json``: every line of a ``strata serve`` run is a JSON object, under the request's id.

A real ``strata serve`` on an empty embedded store answers a query for an
unknown kb (404), a malformed body (422) and, once the test renames its SQL
table away, a store failure (503); its whole output must be JSON lines, the
answers' log lines must carry the id each client got back, and the query's text
must appear nowhere. In process, ``STRATA_LOG__QUERY_TEXT`` decides whether it does.
"""

from __future__ import annotations

import io
import json
import logging
import signal
import socket
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pymilvus.decorators import error_handler
from pymilvus.exceptions import MilvusException

from strata.logs import LogSetup, OncePerInterval, configure
from tests.support.processes import run_strata, start_serve, strata_env, wait_for
from tests.support.stores import fresh_pg_database

QUERY = f"which lighthouse keeper polished the lens {uuid.uuid4().hex}"


def _healthy(http: httpx.Client, process: subprocess.Popen[str]) -> bool:
    assert process.poll() is None, f"strata serve exited: {process.communicate()[1][-2000:]}"
    try:
        return http.get("/health").status_code == 200
    except httpx.TransportError:
        return False


def _raw_answer(url: str, request: bytes) -> tuple[list[bytes], bytes]:
    """The header lines (lower-cased) and body of the answer to ``request`` sent as raw bytes."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        received = b""
        while b"\r\n\r\n" not in received:
            received += sock.recv(65536) or b"\r\n\r\n"
        header, body = received.split(b"\r\n\r\n", 1)
        head = [line.lower() for line in header.split(b"\r\n")]
        length = next((int(line.split(b":")[1]) for line in head if line.startswith(b"content-length:")), 0)
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
    return head, body


def _by_request(lines: list[dict[str, Any]], request_id: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("request_id") == request_id]


@pytest.mark.slow  # strata serve in a process of its own
def test_every_line_of_a_serve_run_is_json_with_the_request_id(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = strata_env(data, STRATA_LOG__FORMAT="json", STRATA_LOG_LEVEL="INFO")
    process, url = start_serve(env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    http = httpx.Client(base_url=url, timeout=60)
    try:
        assert wait_for(lambda: _healthy(http, process), within_s=240), "strata serve did not answer /health"
        unknown = http.post("/retrieve", json={"query": QUERY, "kb_ids": ["no-such-kb"]})
        malformed = http.post("/retrieve", json={"query": QUERY, "top_k": "many"})
        with sqlite3.connect(data / "strata.sqlite3") as db:  # the SQL store fails every read of the kbs
            db.execute("ALTER TABLE strata_knowledge_bases RENAME TO strata_knowledge_bases_gone")
        failed = http.post("/retrieve", json={"query": QUERY, "kb_ids": ["another-kb"]})
        unparsable = _raw_answer(url, b"GET /kbs/caf\xc3\xa9/documents HTTP/1.1\r\nHost: strata\r\n\r\n")
    finally:
        http.close()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-2000:]
    assert (unknown.status_code, malformed.status_code, failed.status_code) == (404, 422, 503), failed.text
    head, body = unparsable  # a path of raw non-ASCII bytes: h11 refuses the request line, before any route
    assert head[0].startswith(b"http/1.1 400") and b"content-type: application/problem+json" in head, head
    assert json.loads(body)["status"] == 400 and json.loads(body)["type"].endswith("/malformed-request")

    raw = [line for line in (stdout + stderr).splitlines() if line.strip()]
    lines = [json.loads(line) for line in raw]  # every line, or this fails naming the one that is not JSON
    assert all(isinstance(line, dict) and {"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert {"uvicorn.error", "strata.api.access", "strata.api.problems"} <= {line["logger"] for line in lines}
    assert not [line for line in raw if QUERY in line], "the query text was logged"

    for response, status, level in ((unknown, 404, "INFO"), (malformed, 422, "INFO"), (failed, 503, "ERROR")):
        request_id = response.headers["X-Request-ID"]
        assert response.json()["request_id"] == request_id
        mine = _by_request(lines, request_id)
        access = [line for line in mine if line["logger"] == "strata.api.access"]
        assert [(line["status"], line["route"], line["level"]) for line in access] == [(status, "/retrieve", "INFO")]
        answer = [line for line in mine if line["logger"] == "strata.api.problems"]
        assert [(line["level"], line["message"].split(" ")[0]) for line in answer] == [(level, str(status))], mine
    # the store failure's own lines (the engine's, under the same id) say what failed
    engine = [
        line for line in _by_request(lines, failed.headers["X-Request-ID"]) if line["logger"].startswith("strata.rag")
    ]
    assert any(line["level"] == "ERROR" and "strata_knowledge_bases" in line["message"] for line in engine), engine


@pytest.fixture
def log_to(request: pytest.FixtureRequest) -> Iterator[Any]:
    """``configure(setup)`` onto a buffer; the handler is removed afterwards."""
    installed: list[logging.Handler] = []

    def to_buffer(setup: LogSetup) -> io.StringIO:
        buffer = io.StringIO()
        handler = configure(setup, stream=buffer)
        assert handler is not None
        installed.append(handler)
        return buffer

    yield to_buffer
    for handler in installed:
        logging.getLogger().removeHandler(handler)
    logging.captureWarnings(False)


@pytest.mark.parametrize("query_text", [True, False])
def test_the_query_text_is_logged_only_when_the_setting_asks(
    open_client: TestClient, log_to: Any, query_text: bool
) -> None:
    buffer = log_to(LogSetup(format="json", level="INFO", query_text=query_text))
    query = f"how deep is the well {uuid.uuid4().hex}"
    response = open_client.post("/retrieve", json={"query": query, "kb_ids": ["no-such-kb"]})
    assert response.status_code == 404
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    mine = _by_request(lines, response.headers["X-Request-ID"])
    assert mine and all(line["level"] == "INFO" for line in mine)  # a client's error: nothing above INFO
    logged = [line for line in mine if line.get("query") == query]
    assert (len(logged) == 1) is query_text and (query in buffer.getvalue()) is query_text


def test_a_milvus_outage_logs_one_json_line_per_failure_kind(log_to: Any) -> None:
    """pymilvus's own path for a failed call (its ``error_handler`` logs each with a traceback), a thousand times
    over two kinds of failure: two lines, each one JSON object without the traceback."""
    buffer = log_to(LogSetup(format="json", level="INFO"))

    @error_handler(func_name="search")
    def search(port: int) -> None:
        raise MilvusException(code=2, message=f"Fail connecting to server on 127.0.0.1:{port}")

    @error_handler(func_name="query")
    def query() -> None:
        raise ValueError("channel closed")

    for attempt in range(500):
        with pytest.raises(MilvusException):
            search(19530 + attempt % 3)
        with pytest.raises(MilvusException):
            query()
    lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
    assert [(line["logger"], line["level"]) for line in lines] == [("pymilvus.decorators", "ERROR")] * 2, lines
    assert "[search]" in lines[0]["message"] and "[query]" in lines[1]["message"]
    assert "Traceback" not in buffer.getvalue() and "exception" not in lines[0]


def test_the_held_back_failures_are_counted_in_the_next_interval() -> None:
    now = [0.0]
    once = OncePerInterval("pymilvus", 60.0, clock=lambda: now[0])

    def record(n: int) -> logging.LogRecord:
        message = f"RPC error: [search] <elapsed:{n}ms>\nTraceback: ..."
        return logging.LogRecord("pymilvus.decorators", logging.ERROR, __file__, 1, message, None, None)

    passed = []
    for n in range(1000):
        now[0] = n * 0.05  # 50 s
        if once.filter(entry := record(n)):
            passed.append(entry.getMessage())
    now[0] = 61.0
    entry = record(1001)
    assert once.filter(entry)
    passed.append(entry.getMessage())
    assert passed == [
        "RPC error: [search] <elapsed:0ms>",
        "RPC error: [search] <elapsed:1001ms> (999 more like it in the last 60 s)",
    ]
    other = logging.LogRecord("strata.rag", logging.ERROR, __file__, 1, "search failed", None, None)
    assert all(once.filter(other) for _ in range(3))  # strata's own records are never held back


@pytest.mark.slow  # strata serve in a process of its own, twice
def test_every_line_of_a_failed_start_is_json(tmp_path: Path) -> None:
    """A start that a configuration error stops, and one a PostgreSQL database behind ``strata db upgrade`` stops:
    under the json format every line either writes, the fatal one included, is a JSON object."""
    json_env = strata_env(tmp_path / "data", STRATA_LOG__FORMAT="json", STRATA_LOG_LEVEL="INFO")
    broken = run_strata(["serve"], {**json_env, "STRATA_API__MAX_CONNECTIONS": "many"}, timeout=120)
    with fresh_pg_database(migrate=False) as pg_url:
        unmigrated = run_strata(["serve"], {**json_env, "STRATA_DATABASE__URL": pg_url}, timeout=120)
    for done, code, said in ((broken, 2, "configuration error"), (unmigrated, 1, "schema is at none")):
        lines = [json.loads(line) for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert done.returncode == code and lines, done.stderr[-2000:]
        assert all(isinstance(line, dict) and {"time", "level", "logger", "message"} <= set(line) for line in lines)
        assert [line["level"] for line in lines if said in line["message"]] == ["CRITICAL"], lines


def test_a_refused_key_is_logged_once_by_the_problems_logger(client: TestClient, log_to: Any) -> None:
    """A 401 is a middleware's answer, not an exception handler's: it is logged as docs/deploy.md says."""
    buffer = log_to(LogSetup(format="json", level="INFO"))
    for headers in ({}, {"Authorization": "Bearer not-a-key-of-this-service"}):
        response = client.get("/kbs", headers=headers)
        assert response.status_code == 401
        lines = [json.loads(line) for line in buffer.getvalue().splitlines()]
        answer = [
            line
            for line in _by_request(lines, response.headers["X-Request-ID"])
            if line["logger"] == "strata.api.problems"
        ]
        assert [(line["level"], line["message"].split(":")[0]) for line in answer] == [("INFO", "401 unauthorized")]
        assert "not-a-key" not in buffer.getvalue()  # the key sent is never logged
