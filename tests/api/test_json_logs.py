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
import sqlite3
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from strata.logs import LogSetup, configure
from tests.support.processes import start_serve, strata_env, wait_for

QUERY = f"which lighthouse keeper polished the lens {uuid.uuid4().hex}"


def _healthy(http: httpx.Client, process: subprocess.Popen[str]) -> bool:
    assert process.poll() is None, f"strata serve exited: {process.communicate()[1][-2000:]}"
    try:
        return http.get("/health").status_code == 200
    except httpx.TransportError:
        return False


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
    finally:
        http.close()
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr[-2000:]
    assert (unknown.status_code, malformed.status_code, failed.status_code) == (404, 422, 503), failed.text

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
