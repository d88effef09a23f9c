"""``strata serve`` receiving SIGTERM while an upload is stuck parsing: it ends the upload after the grace period.

The upload is a .docx of two million empty paragraphs with the element bound raised, so its parse would run
for many minutes; the grace period is one second. The process must exit 0 long before the parse could end,
the upload's client must get an error (or a closed connection), and nothing may be left behind: no parse
process, no ``strata-upload-*`` folder in the service's TMPDIR, no lease on the kb.
"""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import threading
import time
from contextlib import closing
from pathlib import Path

import httpx
import psutil

from strata.stores.sql_schema import kb_leases
from tests.hostile_documents import empty_paragraphs_docx
from tests.support.processes import start_serve, strata_env

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def test_sigterm_ends_an_upload_stuck_in_a_parse_after_the_grace_period(tmp_path: Path) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = strata_env(
        tmp_path / "data",
        TMPDIR=str(temp),
        STRATA_LOG_LEVEL="INFO",
        STRATA_API__SHUTDOWN_GRACE_S="1",
        STRATA_INDEXING__MAX_ELEMENTS="100000000",
        STRATA_INDEXING__PARSE_TIMEOUT_S="3600",
    )
    with open(tmp_path / "serve.log", "w") as log:
        process, url = start_serve(env, stdout=log, stderr=subprocess.STDOUT)
    http = httpx.Client(base_url=url, timeout=httpx.Timeout(600.0, connect=5.0))
    try:
        _wait_ready(process, http, tmp_path / "serve.log")
        outcome: list[httpx.Response | httpx.TransportError] = []
        files = [("files", ("stuck.docx", empty_paragraphs_docx(2_000_000), DOCX))]
        upload = threading.Thread(target=_post, args=(http, "/kbs/stuck/documents", files, outcome))
        upload.start()
        parses = _poll(lambda: _parse_processes(process.pid), "the upload's parse did not start", upload)
        assert _leases(tmp_path / "data") == ["stuck"]

        process.send_signal(signal.SIGTERM)
        code = process.wait(120)  # a hang guard: the grace period is 1 s
        upload.join(60)

        assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
        assert outcome, "the upload got no answer"
        assert isinstance(outcome[0], httpx.TransportError) or outcome[0].status_code in (500, 503), outcome[0]
        assert not [p for p in parses if p.is_running()]
        assert list(temp.glob("strata-upload-*")) == []
        assert _leases(tmp_path / "data") == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        http.close()


def _leases(data_dir: Path) -> list[str]:
    """The kbs whose indexing lease is held, read from the service's SQLite file."""
    with closing(sqlite3.connect(data_dir / "strata.sqlite3")) as db:
        return [kb for (kb,) in db.execute(f"SELECT kb_id FROM {kb_leases.name}")]


def _post(http: httpx.Client, url: str, files: list, outcome: list) -> None:
    try:
        outcome.append(http.post(url, files=files))
    except httpx.TransportError as exc:
        outcome.append(exc)


def _wait_ready(process: subprocess.Popen, http: httpx.Client, log: Path) -> None:
    def ready() -> bool:
        assert process.poll() is None, f"strata serve exited: {log.read_text()[-2000:]}"
        try:
            return http.get("/ready").status_code == 200
        except httpx.TransportError:
            return False

    _poll(ready, "strata serve did not become ready", deadline_s=240)


def _parse_processes(pid: int) -> list[psutil.Process]:
    """The parse children: forked by the service's forkserver (a child of the service with the same command)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.ppid() != pid and "forkserver" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def _poll(check, failure: str, alive: threading.Thread | None = None, deadline_s: float = 120):  # noqa: ANN202
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        assert alive is None or alive.is_alive(), f"{failure}: the request ended first"
        time.sleep(0.05)
    raise AssertionError(failure)
