"""``strata serve`` receiving SIGTERM during an upload: the upload stops, answers, and the process exits in budget.

The first test: an upload stuck in a parse (a .docx of two million empty paragraphs with the element bound
raised, so its parse would run for many minutes); the grace period is one second. The process must exit 0 long
before the parse could end, the upload's client must get an error (or a closed connection), and nothing may be
left behind: no parse process, no ``strata-upload-*`` folder in the service's TMPDIR, no lease on the kb.

The second: an upload in its writes, with the grace the Kubernetes manifests give (``deploy/k8s``): it stops at
its next batch boundary with a problem+json 503 and Retry-After, the process exits inside the pod's budget
(terminationGracePeriodSeconds less preStop's sleep: the time the kubelet leaves it after SIGTERM), and the
next upload of the same file continues the pending version the stopped one left.
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
import pytest
import yaml

from strata.stores.sql_schema import documents, kb_embeddings, kb_leases
from tests.hostile_documents import empty_paragraphs_docx
from tests.support.paths import REPO
from tests.support.processes import start_serve, strata_env

pytestmark = [pytest.mark.slow, pytest.mark.cost(90)]  # strata serve, three times
K8S = REPO / "deploy" / "k8s"

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


def test_sigterm_stops_an_upload_at_a_batch_boundary_and_exits_within_the_pods_budget(tmp_path: Path) -> None:
    grace_s, budget_s = pod_shutdown_budget()
    env = strata_env(
        tmp_path / "data",
        STRATA_LOG_LEVEL="INFO",
        STRATA_API__SHUTDOWN_GRACE_S=str(grace_s),
        STRATA_EMBEDDING__BATCH_SIZE="4",  # an encoder batch (a write step) is short: the stop comes soon after
    )
    files = [("files", ("logbook.md", logbook(200).encode(), "text/markdown"))]
    with open(tmp_path / "serve.log", "w") as log:
        process, url = start_serve(env, stdout=log, stderr=subprocess.STDOUT)
    http = httpx.Client(base_url=url, timeout=httpx.Timeout(600.0, connect=5.0))
    try:
        _wait_ready(process, http, tmp_path / "serve.log")
        outcome: list[httpx.Response | httpx.TransportError] = []
        upload = threading.Thread(target=_post, args=(http, "/kbs/logs/documents", files, outcome))
        upload.start()
        _poll(lambda: _embeddings_cached(tmp_path / "data") > 0, "the upload wrote no batch", upload)

        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        upload.join(budget_s + 60)  # hang guards: the budget is the assertion
        answered_s = time.monotonic() - signalled
        code = process.wait(budget_s + 60)
        exited_s = time.monotonic() - signalled
        print(f"SIGTERM during an upload: answered after {answered_s:.1f} s, exited after {exited_s:.1f} s")

        assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
        assert exited_s <= budget_s, f"exited {exited_s:.1f} s after SIGTERM: the pod gives {budget_s} s"
        answer = outcome[0]
        assert isinstance(answer, httpx.Response), answer
        assert answered_s < grace_s, "the upload ran on to the end of the grace instead of stopping at a batch"
        assert answer.status_code == 503 and answer.headers["content-type"] == "application/problem+json"
        assert int(answer.headers["retry-after"]) > 0 and answer.json()["type"].endswith("/indexing-stopped")
        assert _statuses(tmp_path / "data") == ["pending"]
        assert _leases(tmp_path / "data") == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(30)
        http.close()

    # the next run of the same file continues the pending version: what the stopped one encoded is reused
    with open(tmp_path / "serve-again.log", "w") as log:
        process, url = start_serve(env, stdout=log, stderr=subprocess.STDOUT)
    http = httpx.Client(base_url=url, timeout=httpx.Timeout(600.0, connect=5.0))
    try:
        _wait_ready(process, http, tmp_path / "serve-again.log")
        report = http.post("/kbs/logs/documents", files=files)
        assert report.status_code == 200, report.text
        body = report.json()
        assert (body["added"], body["failed"]) == (1, 0)
        assert any("continue the pending version" in note for note in body["notes"]), body["notes"]
        assert body["embeddings_reused"] > 0, body
        assert _statuses(tmp_path / "data") == ["active"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(120)
        http.close()


def pod_shutdown_budget() -> tuple[float, float]:
    """The grace the ConfigMap gives requests in flight, and the seconds the pod leaves the process after SIGTERM
    (terminationGracePeriodSeconds less preStop's sleep, which the kubelet runs first)."""
    deployment = yaml.safe_load((K8S / "deployment.yaml").read_text(encoding="utf-8"))
    settings = yaml.safe_load((K8S / "configmap.yaml").read_text(encoding="utf-8"))["data"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "strata"]
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    return float(settings["STRATA_API__SHUTDOWN_GRACE_S"]), float(pod["terminationGracePeriodSeconds"]) - float(
        sleep[1]
    )


def logbook(entries: int) -> str:
    """A document of many distinct sections: its leaves take the encoder many batches."""
    lines = ["# Logbook", ""]
    for n in range(entries):
        lines += [f"## Entry {n}", "", f"Day {n}: the tide rose {n % 7} metres and {n * 3 % 11} ships passed.", ""]
    return "\n".join(lines)


def _embeddings_cached(data_dir: Path) -> int:
    with closing(sqlite3.connect(data_dir / "strata.sqlite3")) as db:
        try:
            return db.execute(f"SELECT COUNT(*) FROM {kb_embeddings.name}").fetchone()[0]
        except sqlite3.OperationalError:  # not created yet
            return 0


def _statuses(data_dir: Path) -> list[str]:
    with closing(sqlite3.connect(data_dir / "strata.sqlite3")) as db:
        return [status for (status,) in db.execute(f"SELECT status FROM {documents.name} ORDER BY version")]


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
    """The parse workers: fresh interpreters the service starts (``python -P -c BOOTSTRAP``, loaders._isolated)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if child.cmdline()[1:3] == ["-P", "-c"]:
                found.append(child)
        except (psutil.NoSuchProcess, IndexError):
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
