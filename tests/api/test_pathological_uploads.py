"""Uploads built to be quadratic for the loaders and the chunker never freeze the service.

100 KB of spaces in one line of a .txt froze ``strata serve``: a regular expression held the interpreter
lock of the process serving requests, and a megabyte would have held it for hours. Each file here is the
worst input of one pattern family, at 100 KB and at 1 MB; each upload is indexed or refused with a reason,
and while it runs ``/health`` answers every poll within a second.

The cases run on one worker: with two, the other one would answer ``/health`` while the first was frozen,
and the polls would prove nothing. On ``--workers 2`` the five 1 MB files go up in one upload, and what is
checked besides the answers is that no worker was killed for missing its supervisor's ping.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.shared_service import TENANT_A_WRITE, TENANT_B_WRITE, SharedService, shared_service
from tests.pathological_text import pathology
from tests.support.stores import fresh_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.cost(55)]

SIZES = {"100KB": 100 * 1024, "1MB": 1024 * 1024}
# What each upload must come to: indexed ("added") or failed with a reason containing these words.
OUTCOMES = {
    ("spaces", "100KB"): "added",
    ("spaces", "1MB"): "added",
    ("dots", "100KB"): "added",
    ("dots", "1MB"): "added",
    ("hashes", "100KB"): "added",
    ("hashes", "1MB"): "added",
    ("heading_spaces", "100KB"): "heading_path is",
    ("heading_spaces", "1MB"): "heading_path is",
    ("html_comments", "100KB"): "added",
    ("html_comments", "1MB"): "STRATA_INDEXING__MAX_ELEMENTS",
}
HEALTH_TIMEOUT = httpx.Timeout(1.0)


@pytest.fixture(scope="module")
def temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("service-tmp")


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str, module_pg_url: str, temp_dir: Path
) -> Iterator[SharedService]:
    root = tmp_path_factory.mktemp("pathological")
    with shared_service(root, milvus_server_uri, module_pg_url, workers=1, TMPDIR=str(temp_dir)) as running:
        yield running


class HealthPoller:
    """Polls ``/health`` on its own connection until stopped; every answer's status, or the error."""

    def __init__(self, url: str) -> None:
        self.answers: list[int | str] = []
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, args=(url,), daemon=True)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        self._first.wait(timeout=10)  # the upload starts once the poller is answered (or could not be)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _poll(self, url: str) -> None:
        with httpx.Client(base_url=url, timeout=HEALTH_TIMEOUT) as http:
            while not self._stop.is_set():
                try:
                    self.answers.append(http.get("/health").status_code)
                except httpx.HTTPError as exc:
                    self.answers.append(f"{type(exc).__name__}: {exc}")
                self._first.set()
                self._stop.wait(0.05)  # a poll every 50 ms or so: the pace, not a synchronization


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", ["spaces", "dots", "hashes", "heading_spaces", "html_comments"])
def test_a_pathological_upload_is_indexed_or_refused_while_health_answers(
    service: SharedService, name: str, size: str
) -> None:
    case, filename = pathology(name), f"{size}-{pathology(name).filename}"
    with HealthPoller(service.url) as poller:
        answer = service.upload("alpha", {filename: case.build(SIZES[size])}, key=TENANT_A_WRITE)

    assert answer.status_code == 200, answer.text
    expected = OUTCOMES[(name, size)]
    if expected == "added":
        assert (answer.json()["added"], answer.json()["failed"]) == (1, 0), answer.text
    else:
        (failure,) = answer.json()["failures"]
        assert failure["source"] == filename and expected in failure["reason"], failure
    assert poller.answers, "no /health poll finished"
    assert set(poller.answers) == {200}, [a for a in poller.answers if a != 200][:5]


def test_no_upload_folder_is_left_behind(service: SharedService, temp_dir: Path) -> None:
    case = pathology("dots")
    answer = service.upload("alpha", {case.filename: case.build(SIZES["100KB"])}, key=TENANT_A_WRITE)

    assert answer.status_code == 200, answer.text
    assert list(temp_dir.glob("strata-upload-*")) == []


def test_on_two_workers_the_megabyte_files_are_answered_and_no_worker_is_killed(
    tmp_path: Path, milvus_server_uri: str
) -> None:
    names = ["spaces", "dots", "hashes", "heading_spaces", "html_comments"]
    files = {f"1MB-{pathology(n).filename}": pathology(n).build(SIZES["1MB"]) for n in names}
    with fresh_pg_database() as pg, shared_service(tmp_path, milvus_server_uri, pg, workers=2) as running:
        with HealthPoller(running.url) as poller:
            answer = running.upload("beta", files, key=TENANT_B_WRITE)
        log = running.log_text()

    assert answer.status_code == 200, answer.text
    report = answer.json()
    failed = {f["source"] for f in report["failures"]}
    refused = {f"1MB-{pathology(n).filename}" for n in names if OUTCOMES[(n, "1MB")] != "added"}
    assert (report["added"], failed) == (len(names) - len(refused), refused), report
    assert poller.answers and set(poller.answers) == {200}, [a for a in poller.answers if a != 200][:5]
    assert "] died" not in log and "failed to start" not in log, log[-3000:]  # uvicorn's words for a killed worker
