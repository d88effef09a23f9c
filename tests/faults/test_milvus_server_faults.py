"""Fault matrix, the Milvus server: its process gone mid-run, strata never restarted.

| fault | while it lasts | afterwards |
|---|---|---|
| SIGKILL (a crash) or SIGTERM, then started again on the same port and data dir | ``failed``, the connection error in ``meta.errors``, well inside the deadline; ``/ready`` 200 ``degraded`` (milvus down: a shared store keeps the pod in the Service) within its cache window, ``/ready/detail`` at once with the error; ``/retrieve`` 503 naming Milvus | ``ok`` with the docs of before; ``/ready`` ``ready`` |
| SIGSTOP (hung), then SIGCONT | ``failed``, each search cut at its search timeout (``StoreTimeoutError`` naming the setting) | ``ok`` with the docs of before |
| either, strata's connection left to find the server by itself | | the first or second retrieval after the server answers is ``ok`` |
| killed with no kb indexed yet | ``/ready``'s check says milvus down, not the index opened earlier | milvus ok |

The server is a ``milvus-lite server`` process of each test's own, so these
tests never skip. A restarted server does not remember which collections were
loaded: strata loads its collection again on the first call that finds it
released (``CollectionCalls.call``). The tests ask whether the server answers on a
connection of their own: one from strata's ``milvus_client`` could share grpc's
connection with the index under test and reconnect it for the index.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import httpx
import pytest
from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from strata.api.readiness import check_components, overall
from strata.api.service import Service
from strata.config import DatabaseSettings, Settings
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.types import RetrievalResult
from tests.support import milvus as support_milvus
from tests.support.documents import RESET_QUERY
from tests.support.milvus import MilvusServerProcess
from tests.support.paths import EXAMPLES_KB
from tests.support.processes import start_serve, strata_env
from tests.support.stores import make_settings, opened, settings_for

# a Milvus server killed under strata serve
pytestmark = [pytest.mark.milvus_server, pytest.mark.slow, pytest.mark.cost(65)]
logger = logging.getLogger(__name__)

T = TypeVar("T")

DEADLINE_MS = 5000  # the query deadline of these tests: a failure must come from Milvus, well before it
RECOVERY_WITHIN_S = 60.0  # bound of the poll after the restart
OUTAGE_S = 12.0  # how long clients keep asking a killed server: long enough for grpc's reconnect backoff to grow
FAULTS = ["kill", "stop"]  # SIGKILL, a crash; SIGTERM, an orderly stop


class RestartableMilvus:
    """A private ``milvus-lite server`` that can be taken down and started again on its port and data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.server = MilvusServerProcess(data_dir)

    @property
    def uri(self) -> str:
        return self.server.uri

    def take_down(self, fault: str) -> None:
        getattr(self.server, fault)()
        assert self.server.process is not None and self.server.process.poll() is not None

    def start_again(self) -> None:
        self.server = MilvusServerProcess(self.server.data_dir, port=self.server.port)
        self.server.start()


def answers_yet(uri: str, token: str = "") -> bool:
    """Whether the server answers ``list_collections``, asked on a new connection of this call's own (grpc's
    local subchannel pool): never one strata's clients in this process could reuse."""
    own = {"grpc.use_local_subchannel_pool": 1}
    try:
        client = MilvusClient(uri=uri, token=token, timeout=2.0, dedicated=True, grpc_options=own)
    except (MilvusException, grpc.RpcError):  # pymilvus lets a DEADLINE_EXCEEDED out raw
        return False
    try:
        client.list_collections(timeout=2.0)
        return True
    except (MilvusException, grpc.RpcError):
        return False
    finally:
        client.close()


@pytest.fixture
def milvus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RestartableMilvus]:
    monkeypatch.setattr(support_milvus, "milvus_answers", answers_yet)  # MilvusServerProcess.start polls it
    server = RestartableMilvus(tmp_path / "milvus-server")
    server.server.start()
    yield server
    server.server.stop()


def poll(attempt: Callable[[], T], done: Callable[[T], bool], *, within_s: float) -> list[T]:
    """Every answer of ``attempt`` until one is ``done`` (the last one), bounded by ``within_s``."""
    answers: list[T] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        answers.append(attempt())
        if done(answers[-1]):
            return answers
        time.sleep(0.1)  # the pace of a bounded poll, not a synchronisation
    raise AssertionError(f"no answer was done within {within_s:.0f} s; the last: {answers[-1] if answers else None!r}")


def chunk_ids(result: RetrievalResult) -> list[str]:
    return [d.metadata["chunk_id"] for d in result.docs]


def assert_failed_on_milvus(result: RetrievalResult, milvus: RestartableMilvus) -> None:
    """``failed``, no docs, every route's error naming the server; returned by itself, not by the deadline."""
    meta = result.meta
    assert result.docs == () and (meta.status, meta.mode) == ("failed", "failed"), meta
    assert meta.degraded == ("hybrid_search_failed",)
    assert [e.stage for e in meta.errors] == ["search", "dense_fallback", "sparse_fallback"]
    address = milvus.uri.removeprefix("http://")
    assert all(e.error == "StoreError" and address in e.message for e in meta.errors), meta.errors
    assert meta.timings_ms["total"] < DEADLINE_MS  # the connection error, not the deadline, ended it


# -- in process: Resources and Retriever ------------------------------------------------------


def in_process_settings(
    root: Path,
    database: DatabaseSettings,
    milvus: RestartableMilvus,
    *,
    deadline_ms: int = DEADLINE_MS,
    **milvus_fields: Any,
) -> Settings:
    return make_settings(
        root,
        str(database.url),
        redis_url=None,
        milvus={"uri": milvus.uri, "collection": f"faults_{uuid.uuid4().hex[:8]}", **milvus_fields},
        retrieval={"cache_size": 0, "deadline_ms": deadline_ms},
    )


@pytest.mark.parametrize("fault", FAULTS)
def test_retriever_fails_visibly_while_the_server_is_down_and_recovers_after_its_restart(
    tmp_path: Path, database_settings: DatabaseSettings, milvus: RestartableMilvus, memo_encoder: Any, fault: str
) -> None:
    resources = Resources(in_process_settings(tmp_path, database_settings, milvus), encoder=memo_encoder)
    assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    service = Retriever(resources)
    ask = lambda: service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])  # noqa: E731
    before = ask()
    assert (before.meta.status, before.meta.mode, before.meta.errors) == ("ok", "hybrid", ()) and before.docs

    milvus.take_down(fault)
    for _ in range(2):  # the first call meets the broken channel, the next one a refused connection
        assert_failed_on_milvus(ask(), milvus)

    milvus.start_again()
    restarted = time.monotonic()
    answers = poll(ask, lambda r: r.meta.status == "ok", within_s=RECOVERY_WITHIN_S)
    logger.info(
        "retrieval ok %.2f s after the server answered again (%d tries)", time.monotonic() - restarted, len(answers)
    )
    for waiting in answers[:-1]:  # while the channel reconnects: failed with the reason, never ok and empty
        assert waiting.meta.status == "failed" and waiting.meta.errors and waiting.docs == ()
    after = answers[-1]
    assert (after.meta.mode, after.meta.errors, after.meta.degraded) == ("hybrid", (), ())
    assert chunk_ids(after) == chunk_ids(before) and [d.content for d in after.docs] == [d.content for d in before.docs]
    service.close()
    resources.close()


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_the_first_or_second_retrieval_after_the_server_answers_again_succeeds(
    tmp_path: Path, milvus: RestartableMilvus, memo_encoder: Any, fault: str
) -> None:
    """A killed server started again, or a paused one resumed: once it answers (asked on a connection of the
    test's own), strata's connection, which met the outage, serves the next retrieval or the one after.

    Clients keep asking the killed server for ``OUTAGE_S``, as a service's do: each refused connection
    lengthens grpc's wait before its next attempt (by default up to 120 s)."""
    database = DatabaseSettings(url=f"sqlite:///{tmp_path / 'strata.sqlite3'}")
    resources = Resources(in_process_settings(tmp_path, database, milvus, search_timeout_s=1), encoder=memo_encoder)
    assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    service = Retriever(resources)
    ask = lambda: service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])  # noqa: E731
    before = ask()
    assert before.meta.status == "ok" and before.docs
    process = milvus.server.process
    assert process is not None

    if fault == "kill":
        milvus.take_down("kill")
        outage_ends = time.monotonic() + OUTAGE_S
        while time.monotonic() < outage_ends:
            assert_failed_on_milvus(ask(), milvus)
            time.sleep(0.1)  # the pace of the clients during the outage
        milvus.start_again()  # returns once the server answers
    else:
        process.send_signal(signal.SIGSTOP)
        try:
            assert ask().meta.status == "failed"
        finally:
            process.send_signal(signal.SIGCONT)
        poll(lambda: answers_yet(milvus.uri), bool, within_s=RECOVERY_WITHIN_S)

    answers = poll(ask, lambda r: r.meta.status == "ok", within_s=RECOVERY_WITHIN_S)
    assert len(answers) <= 2, [r.meta.errors for r in answers[:-1]]
    assert chunk_ids(answers[-1]) == chunk_ids(before)
    service.close()
    resources.close()


def test_a_hung_server_costs_each_search_its_search_timeout(
    tmp_path: Path, milvus: RestartableMilvus, memo_encoder: Any
) -> None:
    """SIGSTOP: connections are accepted and never answered. Each search gives up at STRATA_MILVUS__SEARCH_TIMEOUT_S
    (not the 30 s of Milvus's other calls) with a ``StoreTimeoutError`` naming that setting; SIGCONT and it answers."""
    database = DatabaseSettings(url=f"sqlite:///{tmp_path / 'strata.sqlite3'}")
    deadline_ms = 20_000  # far above four 1 s search timeouts, far below one 30 s Milvus timeout
    settings = in_process_settings(tmp_path, database, milvus, deadline_ms=deadline_ms, search_timeout_s=1)
    resources = Resources(settings, encoder=memo_encoder)
    assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    service = Retriever(resources)
    ask = lambda: service.retrieve(RESET_QUERY, 5, kb_ids=["demo"])  # noqa: E731
    before = ask()
    assert before.meta.status == "ok" and before.docs
    process = milvus.server.process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        hung = ask()
    finally:
        process.send_signal(signal.SIGCONT)
    meta = hung.meta
    assert hung.docs == () and (meta.status, meta.degraded) == ("failed", ("hybrid_search_failed",))
    assert [e.stage for e in meta.errors] == ["search", "dense_fallback", "sparse_fallback"]
    named = "within 1 s (STRATA_MILVUS__SEARCH_TIMEOUT_S)"  # the setting, not gRPC's DEADLINE_EXCEEDED
    assert all(e.error == "StoreTimeoutError" and named in e.message for e in meta.errors), meta.errors
    assert meta.timings_ms["total"] < deadline_ms
    after = ask()
    assert after.meta.status == "ok" and chunk_ids(after) == chunk_ids(before)
    service.close()
    resources.close()


# -- a real `strata serve` ----------------------------------------------------------------------


@pytest.fixture
def serve_env(tmp_path: Path, milvus: RestartableMilvus, memo_encoder: Any) -> dict[str, str]:
    """examples/kb indexed as kb 'demo' (SQLite under the data dir, the leaves on the private server)."""
    env = strata_env(
        tmp_path / "data",
        STRATA_MILVUS__URI=milvus.uri,
        STRATA_MILVUS__COLLECTION="faults_serve",
        STRATA_RETRIEVAL__CACHE_SIZE="0",
        STRATA_RETRIEVAL__DEADLINE_MS=str(DEADLINE_MS),
        STRATA_LOG_LEVEL="INFO",
    )
    with opened(settings_for(env), memo_encoder) as resources:
        assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    return env


@pytest.fixture
def served(tmp_path: Path, serve_env: dict[str, str]) -> Iterator[tuple[subprocess.Popen[bytes], httpx.Client]]:
    with open(tmp_path / "serve.log", "wb") as log:  # a file: a pipe nobody reads would fill and block the service
        process, url = start_serve(serve_env, stdout=log, stderr=log)
    http = httpx.Client(base_url=url, timeout=httpx.Timeout(60.0, connect=5.0))
    try:
        yield process, http
    finally:
        http.close()
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def ready(http: httpx.Client) -> httpx.Response | None:
    try:
        return http.get("/ready")
    except httpx.TransportError:
        return None


def test_serve_answers_503_while_the_server_is_down_and_recovers_without_a_restart(
    tmp_path: Path, milvus: RestartableMilvus, served: tuple[subprocess.Popen[bytes], httpx.Client]
) -> None:
    process, http = served
    log = tmp_path / "serve.log"
    settled = lambda r: (r is not None and r.status_code == 200) or process.poll() is not None  # noqa: E731
    up = poll(lambda: ready(http), settled, within_s=240)[-1]  # model load and warm-up
    assert process.poll() is None, log.read_text(errors="replace")[-3000:]
    assert up is not None and up.json()["components"]["milvus"]["status"] == "ok"
    ask = lambda: http.post("/retrieve", json={"query": RESET_QUERY, "top_k": 5, "kb_ids": ["demo"]})  # noqa: E731
    before = ask()
    assert before.status_code == 200 and before.json()["meta"]["status"] == "ok" and before.json()["docs"]

    milvus.take_down("kill")
    # /ready may answer from its check of before for STRATA_API__READY_CACHE_S: a bounded poll. Milvus is shared by
    # every replica, so the pod stays in the Service (200 degraded) and clients get strata's 503 naming Milvus.
    milvus_down = lambda r: r.json()["components"]["milvus"]["status"] == "down"  # noqa: E731
    down = poll(lambda: http.get("/ready"), milvus_down, within_s=RECOVERY_WITHIN_S)[-1]
    assert (down.status_code, down.json()["status"]) == (200, "degraded")
    detail = http.get("/ready/detail")  # no keys configured: open; it checks afresh and names the error
    assert (
        detail.status_code == 200
        and milvus.uri.removeprefix("http://") in detail.json()["components"]["milvus"]["error"]
    )
    refused = ask()
    assert refused.status_code == 503 and refused.headers["content-type"].startswith("application/problem+json")
    problem = refused.json()
    assert problem["meta"]["status"] == "failed" and problem["meta"]["returned"] == 0
    assert "Milvus search" in problem["detail"] and milvus.uri.removeprefix("http://") in problem["detail"]

    milvus.start_again()
    restarted = time.monotonic()
    waits = poll(lambda: http.get("/ready"), lambda r: r.json()["status"] == "ready", within_s=RECOVERY_WITHIN_S)
    logger.info(
        "/ready ready %.2f s after the server answered again (%d tries)", time.monotonic() - restarted, len(waits)
    )
    assert all(r.status_code == 200 and milvus_down(r) for r in waits[:-1])
    assert waits[-1].json()["components"]["milvus"]["status"] == "ok"
    after = ask()
    assert after.status_code == 200 and after.json()["meta"]["status"] == "ok" and after.json()["meta"]["errors"] == []
    assert [d["metadata"]["chunk_id"] for d in after.json()["docs"]] == [
        d["metadata"]["chunk_id"] for d in before.json()["docs"]
    ]
    assert process.poll() is None  # the same strata process throughout


# -- readiness ------------------------------------------------------------------------------------


def test_ready_asks_the_server_even_before_any_kb_exists(
    tmp_path: Path, milvus: RestartableMilvus, memo_encoder: Any
) -> None:
    """An index opened before the outage says nothing of the server now: ``/ready`` makes a real call every time."""
    settings = in_process_settings(tmp_path, DatabaseSettings(url=f"sqlite:///{tmp_path / 'strata.sqlite3'}"), milvus)
    service = Service(settings, Resources(settings, encoder=memo_encoder), owns_resources=True)
    assert service.resources.documents.kbs.list_kbs() == [] and check_components(service)["milvus"]["status"] == "ok"

    milvus.take_down("kill")
    down = check_components(service)
    assert down["milvus"]["status"] == "down" and milvus.uri.removeprefix("http://") in down["milvus"]["error"]
    assert overall(down, frozenset({"encoder"})) == ("degraded", 200)  # shared: the pod stays reachable
    assert overall(down, frozenset({"encoder", "milvus"})) == (
        "unavailable",
        503,
    )  # STRATA_API__READY_REQUIRES=["milvus"]

    milvus.start_again()
    checks = poll(
        lambda: check_components(service), lambda c: c["milvus"]["status"] == "ok", within_s=RECOVERY_WITHIN_S
    )
    assert overall(checks[-1], frozenset({"encoder", "milvus"})) == ("ready", 200)
    service.retriever.close()
    service.resources.close()
