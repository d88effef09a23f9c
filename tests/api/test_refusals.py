"""Every refusal is a clear answer: a problem document with its status, the request id in body and
header, Retry-After where waiting helps, and the name of what was refused.

In-process tests use the shared test stores; the last ones run ``strata serve --workers 2`` on PostgreSQL and a
Milvus server, where two uploads to one kb meet in two processes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select
from sqlalchemy.engine import Engine

from strata.api.problems import MEDIA_TYPE, TYPE_BASE
from strata.stores.lease import KbLease
from strata.stores.sql_schema import kb_leases
from tests.api.shared_service import SharedService, shared_service
from tests.api.test_serve_process import slow_document
from tests.support.api import auth

pytestmark = pytest.mark.cost(20)

ADMIN = auth("admin-key")
T = TypeVar("T")


def assert_refused(response: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    """A problem document of ``slug`` whose request id is the header's."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == MEDIA_TYPE
    body = response.json()
    assert body["type"] == TYPE_BASE + slug and body["status"] == status
    assert body["request_id"] and response.headers["x-request-id"] == body["request_id"]
    return body


def one_file(name: str = "note.md", text: str = "# Note\n\nThe ferry leaves at noon.\n") -> list[tuple[str, Any]]:
    return [("files", (name, text.encode(), "text/markdown"))]


# -- in-process --------------------------------------------------------------------------------------------------


def test_an_upload_to_a_kb_another_process_indexes_is_a_409_with_retry_after(client: TestClient) -> None:
    kb = f"leased-{uuid.uuid4().hex[:8]}"
    documents = client.app.state.service.resources.documents
    with KbLease(documents, kb, owner="indexer-elsewhere:pid 4242:held"):
        refused = client.post(f"/kbs/{kb}/documents", files=one_file(), headers=ADMIN)
        body = assert_refused(refused, 409, "kb-being-written")
        assert 1 <= int(refused.headers["retry-after"]) <= 60  # until the holder's lease could expire
        assert repr(kb) in body["detail"] and "indexer-elsewhere" not in body["detail"]
        assert client.get(f"/kbs/{kb}/stats", headers=ADMIN).status_code == 404  # the refused upload wrote nothing
    indexed = client.post(f"/kbs/{kb}/documents", files=one_file(), headers=ADMIN)
    assert indexed.status_code == 200 and indexed.json()["added"] == 1


def test_a_write_to_a_kb_another_request_of_the_process_writes_is_refused_alike(client: TestClient) -> None:
    kb = f"busy-{uuid.uuid4().hex[:8]}"
    lock = client.app.state.service._kb_lock(kb)  # what a running upload of this worker holds
    with lock:
        refused = client.post(f"/kbs/{kb}/documents", files=one_file(), headers=ADMIN)
        assert_refused(refused, 409, "kb-being-written")
        assert refused.headers["retry-after"] == "5"
        assert_refused(client.post("/kbs", json={"kb_id": kb}, headers=ADMIN), 409, "kb-being-written")


def test_an_unexpected_error_is_a_500_with_the_request_id_in_the_header_too(client: TestClient) -> None:
    def crash() -> None:
        raise RuntimeError("a bug")

    client.app.add_api_route("/test-crash", crash, methods=["GET"])
    crashed = client.get("/test-crash", headers={**ADMIN, "X-Request-ID": "trace-500"})
    assert crashed.status_code == 500 and crashed.headers["x-request-id"] == "trace-500"
    assert crashed.json()["request_id"] == "trace-500" and "a bug" not in crashed.text


def test_a_file_name_over_1024_characters_is_named_shortened(client: TestClient) -> None:
    name = "minutes-of-the-harbour-board-" * 40 + ".md"  # 1,163 characters
    body = assert_refused(
        client.post("/kbs/garden/documents", files=one_file(name), headers=ADMIN), 422, "invalid-input"
    )
    assert repr(name[:80] + "…") in body["detail"] and f"{len(name)} characters" in body["detail"]
    assert len(body["detail"]) < 300  # never the whole name back
    megabyte = client.post("/kbs/garden/documents", files=one_file("x" * 2**20 + ".md"), headers=ADMIN)
    assert megabyte.status_code in (400, 413, 422) and len(megabyte.content) < 2000  # the parser may refuse it first


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/kbs", {"GET", "POST", "OPTIONS"}),
        ("/kbs/demo/documents", {"GET", "POST", "OPTIONS"}),
        ("/kbs/demo/documents/auth.md", {"DELETE", "OPTIONS"}),
    ],
)
def test_options_and_an_unknown_method_list_every_method_of_the_path(
    client: TestClient, path: str, methods: set[str]
) -> None:
    options = client.options(path)
    assert options.status_code == 204 and set(options.headers["allow"].split(", ")) == methods
    refused = client.put(path, headers=ADMIN)
    assert_refused(refused, 405, "method-not-allowed")
    assert refused.headers["allow"] == options.headers["allow"]


def test_creating_a_kb_that_exists_is_a_declared_200(client: TestClient) -> None:
    again = client.post("/kbs", json={"kb_id": "demo"}, headers=ADMIN)
    assert again.status_code == 200 and again.json() == {"kb_id": "demo", "created": False}
    declared = client.get("/openapi.json").json()["paths"]["/kbs"]["post"]["responses"]
    assert {"200", "201"} <= set(declared)
    assert (
        declared["200"]["content"]["application/json"]["schema"]
        == declared["201"]["content"]["application/json"]["schema"]
    )


# -- strata serve --workers 2 --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str, module_pg_url: str
) -> Iterator[SharedService]:
    """One service for both tests (each writes a kb of its own; a worker one kills, uvicorn replaces)."""
    root = tmp_path_factory.mktemp("served")
    temporary = root / "tmp"  # the service's TMPDIR: where its upload folders are
    temporary.mkdir()
    with shared_service(
        root, milvus_server_uri, module_pg_url, workers=2, seed=False, TMPDIR=str(temporary)
    ) as service:
        service.temporary = temporary  # type: ignore[attr-defined]
        yield service


@pytest.fixture
def leases(module_pg_url: str) -> Iterator[Engine]:
    engine = create_engine(module_pg_url)
    yield engine
    engine.dispose()


def holder_of(leases: Engine, kb: str) -> str | None:
    with leases.connect() as conn:
        return conn.execute(select(kb_leases.c.owner).where(kb_leases.c.kb_id == kb)).scalar()


def poll(value: Callable[[], T | None], upload: threading.Thread, failure: str, within_s: float = 120) -> T:
    """``value()`` once it is set, while the slow upload still runs (bounded polling of another process)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        found = value()
        if found:
            return found
        assert upload.is_alive(), f"{failure}: the upload finished first"
        time.sleep(0.02)
    raise AssertionError(failure)


def upload_in_background(
    service: SharedService, kb: str, outcome: list[Any], paragraphs: int = 600
) -> threading.Thread:
    """``slow_document(paragraphs)`` uploaded in a thread: indexing its leaves holds the kb's lease for seconds."""

    def send() -> None:
        try:
            outcome.append(service.upload(kb, {"logbook.md": slow_document(paragraphs)}))
        except httpx.TransportError as exc:  # its worker was killed
            outcome.append(exc)

    upload = threading.Thread(target=send)
    upload.start()
    return upload


@pytest.mark.slow
def test_two_uploads_to_one_kb_one_is_indexed_the_other_refused(served: SharedService, leases: Engine) -> None:
    kb = f"logs-{uuid.uuid4().hex[:8]}"  # the module's tests share one PostgreSQL database
    outcome: list[Any] = []
    # 200 leaves to encode (the 80 of test_serve_process's document at most already in the tests' vector cache):
    # seconds of holding the lease, where the second upload needs milliseconds; this upload runs to its end
    upload = upload_in_background(served, kb, outcome, paragraphs=200)
    poll(lambda: holder_of(leases, kb), upload, "the first upload never took the lease")
    second = served.upload(kb, {"note.md": "# Note\n\nThe ferry leaves at noon.\n"})
    upload.join(300)
    assert outcome and outcome[0].status_code == 200, outcome
    assert (outcome[0].json()["added"], outcome[0].json()["failed"]) == (1, 0)
    body = assert_refused(second, 409, "kb-being-written")
    assert int(second.headers["retry-after"]) >= 1 and repr(kb) in body["detail"]
    assert holder_of(leases, kb) is None  # released when the run finished
    again = served.upload(kb, {"note.md": "# Note\n\nThe ferry leaves at noon.\n"})
    assert again.status_code == 200 and again.json()["added"] == 1


@pytest.mark.slow
def test_a_lease_whose_worker_was_killed_is_taken_over_at_once(served: SharedService, leases: Engine) -> None:
    kb = f"logs-{uuid.uuid4().hex[:8]}"
    outcome: list[Any] = []
    upload = upload_in_background(served, kb, outcome)
    owner = poll(lambda: holder_of(leases, kb), upload, "the upload never took the lease")
    worker = int(owner.split(":pid ", 1)[1].split(":", 1)[0])
    assert worker != served.process.pid  # a worker of the service holds it, not its supervisor
    os.kill(worker, signal.SIGKILL)
    upload.join(120)
    assert outcome and isinstance(outcome[0], httpx.TransportError), outcome
    assert holder_of(leases, kb) == owner  # the killed worker could not release it
    left = sorted(p.name for p in served.temporary.iterdir())  # type: ignore[attr-defined]
    assert any(name.startswith(f"strata-upload-{worker}-") for name in left), left  # nor remove its folder
    # the lease would run for up to a minute more; the holder is gone, so the next upload takes it now
    again = served.upload(kb, {"note.md": "# Note\n\nThe ferry leaves at noon.\n"})
    assert again.status_code == 200, again.text
    assert again.json()["added"] == 1 and holder_of(leases, kb) is None
    left = [p.name for p in served.temporary.iterdir() if p.name.startswith("strata-upload-")]  # type: ignore[attr-defined]
    assert left == []  # the next upload (or the worker that replaced it) removed it
