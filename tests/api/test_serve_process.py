"""``strata serve`` as a process of its own: ready, retrieve, index --server, delete, the lock message, SIGTERM.

The service keeps its leaves in the Milvus Lite file of a temporary data dir, or in a collection on
the Milvus server (``milvus_target``), with SQLite beside it; the test talks to it over loopback HTTP
only. On the Lite file a second process is refused; on a server it indexes beside the service.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata.client import StrataClient
from strata.indexing.report import IndexReport
from tests.support.documents import write_files
from tests.support.milvus import MilvusTarget
from tests.support.processes import run_strata, start_serve, strata_env

pytestmark = [pytest.mark.slow, pytest.mark.cost(35)]  # strata serve in a process of its own

NOTES = {
    "lighthouse.md": "---\nmodule: coast\nskill_points: [lamp]\n---\n# Lighthouse\n\n"
    "The keeper polishes the Fresnel lens every Tuesday at dawn and writes it in the brass ledger.\n",
    "bakery.md": "# Bakery\n\nThe sourdough starter is fed with rye flour at six in the evening.\n",
}
LATE_DOC = "# Orchard\n\nThe pear trees of the north orchard are pruned in February, before the sap rises.\n"


def slow_document(paragraphs: int = 80) -> str:
    """A document with many distinct leaves: indexing it keeps the encoder busy for seconds."""
    lines = ["# Logbook", ""]
    for n in range(paragraphs):
        lines += [
            f"## Entry {n}",
            "",
            f"Day {n}: the tide rose {n % 7} metres, wind from bearing {n * 13 % 360}, "
            f"{n * 3 % 11} ships passed and the lamp used {n * 17 % 50} litres of oil.",
            "",
        ]
    return "\n".join(lines)


class Service:
    def __init__(self, process: subprocess.Popen[str], url: str) -> None:
        self.process, self.url = process, url
        self.http = httpx.Client(base_url=url, timeout=httpx.Timeout(120.0, connect=5.0))

    def wait_ready(self, deadline_s: float = 240) -> dict[str, Any]:
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"strata serve exited: {self.process.communicate()[1][-2000:]}"
            try:
                response = self.http.get("/ready")
                if response.status_code == 200:
                    return response.json()
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError("strata serve did not become ready")

    def in_progress(self, route: str) -> float:
        text = self.http.get("/metrics").text
        match = re.search(rf'strata_http_requests_in_progress\{{route="{re.escape(route)}"\}} ([0-9.]+)', text)
        return float(match.group(1)) if match else 0.0


@pytest.fixture
def service(tmp_path: Path, milvus_target: MilvusTarget) -> Iterator[Service]:
    # a grace so long that only the stop at SIGTERM can end the slow upload below in time
    env = strata_env(
        tmp_path / "data", STRATA_LOG_LEVEL="INFO", STRATA_API__SHUTDOWN_GRACE_S="600", **milvus_target.env()
    )
    process, url = start_serve(env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    served = Service(process, url)
    served.env = env  # type: ignore[attr-defined]
    yield served
    if process.poll() is None:
        process.kill()
        process.wait(30)
    served.http.close()


def test_serve_answers_indexes_through_server_and_drains_on_sigterm(service: Service, tmp_path: Path) -> None:
    ready = service.wait_ready()
    assert ready["status"] == "ready" and ready["components"]["milvus"]["status"] == "ok"
    env = service.env  # type: ignore[attr-defined]

    # strata index --server: the same --json report as a local run, written by the service
    notes = write_files(tmp_path / "notes", NOTES)
    done = run_strata(["index", str(notes), "--kb", "notes", "--server", service.url, "--json"], env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert set(report) == set(IndexReport(kb="notes").to_dict()) and (report["added"], report["failed"]) == (2, 0)

    answer = service.http.post(
        "/retrieve", json={"query": "When is the Fresnel lens polished?", "top_k": 2, "kb_ids": ["notes"]}
    )
    assert answer.status_code == 200 and answer.json()["docs"][0]["metadata"]["source"] == "lighthouse.md"

    # a file added while the service runs is found by the next retrieval (STRATA_SERVER__URL instead of --server)
    late = write_files(tmp_path / "late", {"orchard.md": LATE_DOC})
    done = run_strata(["index", str(late / "orchard.md"), "--kb", "notes"], {**env, "STRATA_SERVER__URL": service.url})
    assert done.returncode == 0 and "1 added" in done.stdout, done.stderr
    found = service.http.post(
        "/retrieve", json={"query": "when are the pear trees pruned", "top_k": 1, "kb_ids": ["notes"]}
    )
    assert found.json()["docs"][0]["metadata"]["doc_id"] == "orchard.md"

    # a file that fails and a path that does not exist: reported, exit status 1, as a local run
    broken = write_files(tmp_path / "broken", {"empty.md": ""})
    done = run_strata(["index", str(broken), str(tmp_path / "nowhere"), "--kb", "notes", "--server", service.url], env)
    assert done.returncode == 1 and "2 failed" in done.stdout, done.stdout + done.stderr
    assert f"FAILED {broken / 'empty.md'}: empty file" in done.stdout and "no such file or directory" in done.stdout

    # the Python client: the library's call and record, over HTTP
    with StrataClient(service.url) as client:
        result = client.retrieve_documents("sourdough starter feeding", 1, kb_ids=["notes"])
    assert result.meta.status == "ok" and result.docs[0].metadata["doc_id"] == "bakery.md"
    assert "trace" in result.docs[0].metadata

    # delete over HTTP: gone from every store, SQL leaves = Milvus leaves
    before = service.http.get("/kbs/notes/stats").json()
    gone = service.http.delete("/kbs/notes/documents/bakery.md")
    assert gone.status_code == 200, gone.text
    stats = service.http.get("/kbs/notes/stats").json()
    assert stats["documents"] == before["documents"] - 1 and stats["consistent"] is True
    assert stats["leaves_in_milvus"] == stats["chunks_by_level"]["3"] < before["leaves_in_milvus"]
    after = service.http.post("/retrieve", json={"query": "sourdough starter feeding", "top_k": 3, "kb_ids": ["notes"]})
    assert after.status_code == 200 and "bakery.md" not in {d["metadata"]["doc_id"] for d in after.json()["docs"]}

    local = run_strata(["index", str(late), "--kb", "local"], env)
    if "STRATA_MILVUS__URI" not in env:
        # a local `strata index` cannot open the Lite file the service holds, and says what to do instead
        assert local.returncode == 1 and "IndexLockedError" in local.stderr and "--server" in local.stderr
    else:
        # on a Milvus server it indexes beside the service, which serves the new kb at once
        assert local.returncode == 0 and "1 added" in local.stdout, local.stderr
        there = service.http.post(
            "/retrieve", json={"query": "when are the pear trees pruned", "top_k": 1, "kb_ids": ["local"]}
        )
        assert there.status_code == 200 and there.json()["docs"][0]["metadata"]["doc_id"] == "orchard.md"

    # SIGTERM while a slow upload is being indexed: it stops at its next batch boundary, long before the grace
    # ends (600 s), answering 503 with Retry-After; then the process exits 0 (test_serve_shutdown: what is left)
    outcome: list[httpx.Response] = []
    files = [("files", ("logbook.md", slow_document().encode(), "text/markdown"))]
    upload = threading.Thread(target=lambda: outcome.append(service.http.post("/kbs/logs/documents", files=files)))
    upload.start()
    deadline = time.monotonic() + 60
    while service.in_progress("/kbs/{kb}/documents") < 1 and upload.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert upload.is_alive(), "the upload finished before the signal could be sent"
    service.process.send_signal(signal.SIGTERM)
    upload.join(180)
    assert outcome and outcome[0].status_code == 503, outcome
    assert outcome[0].headers["content-type"] == "application/problem+json" and outcome[0].headers["retry-after"]
    assert outcome[0].json()["type"].endswith("/indexing-stopped")
    assert service.process.wait(60) == 0
    stderr = service.process.stderr.read() if service.process.stderr else ""
    assert "without authentication" in stderr  # no keys: said at start-up
    access = [json.loads(line.split(": ", 1)[1]) for line in stderr.splitlines() if "strata.api.access" in line]
    retrievals = [entry for entry in access if entry["route"] == "/retrieve"]
    assert retrievals and all(
        entry["status"] == 200 and entry["ms"] > 0 and entry["request_id"] for entry in retrievals
    )


def test_serve_refuses_what_cannot_work(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    workers = run_strata(["serve", "--workers", "2"], env, timeout=120)
    assert workers.returncode == 2 and workers.stderr.count("\n") == 1
    assert "Milvus Lite" in workers.stderr and "one process" in workers.stderr
    exposed = run_strata(["serve", "--host", "0.0.0.0"], env, timeout=120)
    assert exposed.returncode == 2 and "without API keys" in exposed.stderr and "--insecure" in exposed.stderr
