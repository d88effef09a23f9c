"""``StrataClient`` and ``AsyncStrataClient`` over real HTTP (the service's app served by uvicorn on loopback, in a
thread) against the in-process library: every client test runs for both (the ``connect`` fixture), the async one
awaited on an event loop of its own."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import io
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from strata.api import create_app
from strata.client import AsyncStrataClient, StrataClient
from strata.config import ApiKeyGrant, Settings
from strata.errors import InvalidArgumentError, NotFoundError, ServiceError
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.stores.catalog import Catalog
from strata.types import Filters, RetrievalMeta, RetrievalResult, RetrievedDocument, StageError
from tests.support.api import KEYS
from tests.support.processes import free_port, run_strata, strata_env

RESET_QUERY = "密码重置链接多久失效？"

pytestmark = pytest.mark.integration


class Awaited:
    """An ``AsyncStrataClient`` called like a ``StrataClient``: each call awaited on one event loop of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = AsyncStrataClient(*args, **kwargs)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._client, name)
        return lambda *args, **kwargs: self._loop.run_until_complete(method(*args, **kwargs))

    def __enter__(self) -> Awaited:
        return self

    def __exit__(self, *_: object) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()


Connect = Callable[..., Any]  # StrataClient's arguments -> a client (a StrataClient, or an Awaited async one)


@pytest.fixture(params=["StrataClient", "AsyncStrataClient"])
def connect(request: pytest.FixtureRequest) -> Connect:
    return StrataClient if request.param == "StrataClient" else Awaited


def test_both_clients_have_the_same_methods_arguments_and_defaults() -> None:
    """One API twice: the same public names, parameters, kinds and defaults; every async one a coroutine."""

    def methods(client: type) -> dict[str, list[tuple[str, object, object]]]:
        public = {n: m for n, m in vars(client).items() if not n.startswith("_") and callable(m)}
        return {
            n: [(p.name, p.kind, p.default) for p in inspect.signature(m).parameters.values()]
            for n, m in public.items()
        }

    assert methods(AsyncStrataClient) == methods(StrataClient)
    assert all(inspect.iscoroutinefunction(m) for n, m in vars(AsyncStrataClient).items() if n in methods(StrataClient))
    init = {c: inspect.signature(c).parameters for c in (StrataClient, AsyncStrataClient)}
    assert list(init[StrataClient]) == list(init[AsyncStrataClient])


@pytest.fixture(scope="module")
def served_url(stores: tuple[Settings, Resources]) -> Iterator[str]:
    base, resources = stores
    api = base.api.model_copy(update={"keys": {k: ApiKeyGrant(**v) for k, v in KEYS.items()}})
    settings = base.model_copy(update={"api": api})  # the engine answers from the shared stores' query cache
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, resources=resources), host="127.0.0.1", port=port, log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_the_client_returns_what_the_library_returns(
    connect: Connect, served_url: str, stores: tuple[Settings, Resources]
) -> None:
    with connect(served_url, "admin-key") as client:
        remote = client.retrieve_documents(RESET_QUERY, 3, kb_ids=["demo"], filters=Filters(modules=("auth",)))
    local = Retriever(stores[1]).retrieve(RESET_QUERY, 3, kb_ids=["demo"], filters=Filters(modules=("auth",)))
    assert [d.metadata["chunk_id"] for d in remote.docs] == [d.metadata["chunk_id"] for d in local.docs]
    assert [d.content for d in remote.docs] == [d.content for d in local.docs]
    assert [round(d.score, 9) for d in remote.docs] == [round(d.score, 9) for d in local.docs]
    assert remote.docs[0].metadata["trace"] == local.docs[0].metadata["trace"]
    assert (remote.meta.status, remote.meta.mode, remote.meta.kb_ids, remote.meta.filters) == (
        local.meta.status,
        local.meta.mode,
        local.meta.kb_ids,
        local.meta.filters,
    )


def test_the_client_raises_like_the_library(connect: Connect, served_url: str) -> None:
    with connect(served_url, "demo-reader-key") as client:
        with pytest.raises(InvalidArgumentError, match="top_k"):  # a ValueError, as the library's
            client.retrieve_documents("x", 0)
        with pytest.raises(NotFoundError, match="garden"):
            client.retrieve_documents("tomatoes", 3, kb_ids=["garden"])  # not this key's: as if it did not exist
        assert {k["kb_id"] for k in client.list_kbs()} == {"demo"}
    with connect(served_url, "wrong-key") as client, pytest.raises(ServiceError) as refused:
        client.retrieve_documents("x", 3)
    assert refused.value.status == 401 and refused.value.problem["title"] == "Unauthorized"
    with connect(f"http://127.0.0.1:{free_port()}") as client, pytest.raises(ServiceError, match="cannot reach"):
        client.retrieve_documents("x", 3)


# -- the library's call, its deadline and its timeout ----------------------------------------------


@pytest.mark.parametrize("client", [StrataClient, AsyncStrataClient])
def test_the_client_takes_the_librarys_arguments(client: type) -> None:
    """Same parameters, kinds and defaults as ``strata.rag.retrieve_documents``; the client adds ``timeout``
    (and takes no ``settings``: the service's apply)."""
    from strata.rag.retrieve import retrieve_documents

    def params(function: object, leave_out: set[str]) -> list[tuple[str, object, object]]:
        found = inspect.signature(function).parameters.values()  # type: ignore[arg-type]
        return [(p.name, p.kind, p.default) for p in found if p.name not in leave_out]

    assert params(client.retrieve_documents, {"self", "timeout"}) == params(retrieve_documents, {"settings"})


def test_the_client_passes_strategy_expand_and_queries(
    connect: Connect, served_url: str, stores: tuple[Settings, Resources]
) -> None:
    options = {"strategy": "fusion", "expand": False, "queries": ["how long is a reset link valid"]}
    with connect(served_url, "admin-key") as client:
        remote = client.retrieve_documents(RESET_QUERY, 3, kb_ids=["demo"], **options)
    local = Retriever(stores[1]).retrieve(RESET_QUERY, 3, kb_ids=["demo"], **options)
    assert remote.meta.strategy == local.meta.strategy == "fusion"
    assert remote.meta.query_variants == local.meta.query_variants and remote.meta.expansion == local.meta.expansion
    assert [d.metadata["chunk_id"] for d in remote.docs] == [d.metadata["chunk_id"] for d in local.docs]


def test_a_requests_deadline_is_the_services_budget(connect: Connect, served_url: str) -> None:
    query = f"{RESET_QUERY} {uuid.uuid4().hex}"  # a query of its own: another test's answer in the cache is no run
    with connect(served_url, "admin-key") as client:
        hurried = client.retrieve_documents(query, 3, kb_ids=["demo"], deadline_ms=1)
        relaxed = client.retrieve_documents(query, 3, kb_ids=["demo"], deadline_ms=600_000)
    reasons = set(hurried.meta.degraded) | {e.error for e in hurried.meta.errors}
    assert hurried.meta.cache == "miss", hurried.meta
    assert hurried.meta.status != "ok" and reasons & {"deadline_exceeded", "DeadlineExceeded"}, hurried.meta
    assert relaxed.meta.status == "ok"  # a longer deadline than the service's own is cut to it, not refused


def test_a_service_that_never_answers_raises_within_the_timeout(connect: Connect) -> None:
    import socket

    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with connect(url) as client:
            started = time.monotonic()
            with pytest.raises(ServiceError, match="no answer") as raised:
                client.retrieve_documents("x", 3, timeout=0.5)
            assert time.monotonic() - started < 5 and raised.value.status == 0
            started = time.monotonic()
            with pytest.raises(ServiceError):
                client.retrieve_documents("x", 3, deadline_ms=200)  # the timeout follows the deadline
            assert time.monotonic() - started < 8


# -- answers of a service of another version (httpx's own fake transport answers) -------------------


@pytest.fixture
def answering(connect: Connect) -> Callable[[int, dict], Any]:
    """A client (of either kind) whose every request gets ``status`` and ``body``."""

    def client(status: int, body: dict) -> Any:
        transport = httpx.MockTransport(lambda _: httpx.Response(status, json=body))  # answers sync and async calls
        return connect("http://strata.test", transport=transport)

    return client


def test_a_newer_services_fields_are_ignored_and_an_older_ones_missing_fields_default(answering: Callable) -> None:
    result = RetrievalResult(
        (RetrievedDocument("a", 0.5, {"chunk_id": "c1"}), RetrievedDocument("b", float("nan"))),
        RetrievalMeta("q", 2, 6, status="degraded", degraded=("rerank_failed",), timings_ms={"search": 1.5}),
    )
    body = result.to_dict()
    newer = {
        **body,
        "answer_id": "x",
        "docs": [{**d, "rank": 1} for d in body["docs"]],
        "meta": {**body["meta"], "new_field": {"n": 1}},
    }
    with answering(200, newer) as client:
        parsed = client.retrieve_documents("q", 2)
    assert parsed.docs[0] == result.docs[0] and parsed.meta == result.meta
    assert math.isnan(parsed.docs[1].score)  # null on the wire
    older = {**body, "meta": {k: v for k, v in body["meta"].items() if k not in ("bm25_query", "expansion", "cache")}}
    with answering(200, older) as client:
        assert client.retrieve_documents("q", 2).meta == result.meta


def test_a_failed_retrieval_from_another_version_still_reads_as_failed(answering: Callable) -> None:
    errors = [{"stage": "search", "error": "StoreError", "message": "Milvus down", "hint": "new"}]
    readable = {
        "type": "about:blank",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "retrieval failed",
        "meta": {
            "query": "q",
            "top_k": 2,
            "candidate_k": 6,
            "status": "failed",
            "mode": "failed",
            "errors": errors,
            "new_field": 1,
        },
    }
    with answering(503, readable) as client:
        meta = client.retrieve_documents("q", 2).meta
    expected = ("failed", "failed", 6, (StageError("search", "StoreError", "Milvus down"),))
    assert (meta.status, meta.mode, meta.candidate_k, meta.errors) == expected
    unreadable = {**readable, "meta": {"query": "q", "errors": errors}}  # no top_k, no candidate_k
    with answering(503, unreadable) as client:
        meta = client.retrieve_documents("q", 2).meta
    assert (meta.status, meta.query, meta.errors[0].message) == ("failed", "q", "Milvus down")


def test_a_refused_request_raises_invalid_argument(answering: Callable) -> None:
    problem = {"type": "about:blank", "title": "Invalid Input", "status": 422, "detail": "top_k must be at least 1"}
    with answering(422, problem) as client, pytest.raises(InvalidArgumentError, match="top_k must be at least 1"):
        client.retrieve_documents("q", 2)


# -- strata index --server: the local command's deletions and report --------------------------------

FOLDER = {
    "alpha.md": "# Alpha\n\nThe alpha lamp is lit at dusk by the keeper.\n",
    "beta.md": "# Beta\n\nThe beta gate closes at nine when the ferry leaves.\n",
    "sub/gamma.md": "# Gamma\n\nGamma hives are checked for mites every June.\n",
}


def write_files(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def index_remote(url: str, kb: str, *paths: Path, delete_missing: bool = False) -> dict:
    import json

    from strata.cli import build_parser
    from strata.cli.remote_index import cmd_remote_index

    argv = ["index", *map(str, paths), "--kb", kb, "--server", url, "--json", *(["--delete-missing"] * delete_missing)]
    args = build_parser().parse_args(argv)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cmd_remote_index(args, Settings(_env_file=None), url=url, api_key="admin-key")
    return json.loads(out.getvalue())


def test_index_through_the_server_deletes_and_reports_what_the_local_command_does(
    served_url: str, stores: tuple[Settings, Resources], tmp_path: Path
) -> None:
    from strata.indexing.pipeline import Indexer

    indexer, catalog = Indexer(stores[1]), Catalog(stores[1].documents.engine)
    folder = write_files(tmp_path / "notes", FOLDER)
    other = write_files(tmp_path / "other", {"delta.md": "# Delta\n\nThe delta barge carries salt on Fridays.\n"})
    os.mkfifo(folder / "pipe.md")
    (folder / "gone.md").symlink_to(tmp_path / "nowhere.md")
    kbs = {"local": f"dm-local-{uuid.uuid4().hex[:6]}", "remote": f"dm-remote-{uuid.uuid4().hex[:6]}"}

    reports = {
        "local": indexer.index_paths([folder], kb_id=kbs["local"]).to_dict(),
        "remote": index_remote(served_url, kbs["remote"], folder),
    }
    indexer.index_paths([other], kb_id=kbs["local"])
    index_remote(served_url, kbs["remote"], other)
    (folder / "beta.md").unlink()
    again = {
        "local": indexer.index_paths([folder], kb_id=kbs["local"], delete_missing=True).to_dict(),
        "remote": index_remote(served_url, kbs["remote"], folder, delete_missing=True),
    }

    def entries(report: dict, key: str) -> list[tuple[str, str]]:
        return sorted((e["source"], e["reason"]) for e in report[key])

    for side in ("local", "remote"):
        assert entries(reports[side], "failures") == entries(reports["local"], "failures"), side
        assert entries(again[side], "skipped") == entries(again["local"], "skipped"), side
        assert (again[side]["deleted"], again[side]["failed"]) == (1, 2), (side, again[side])
    assert {e["source"] for e in reports["remote"]["failures"]} == {str(folder / "pipe.md"), str(folder / "gone.md")}
    kept = {side: sorted(e.doc_id for e in catalog.documents(kb)) for side, kb in kbs.items()}
    assert kept["local"] == kept["remote"] == ["alpha.md", "delta.md", "sub/gamma.md"]


def test_two_folders_named_alike_are_two_roots_and_one_folder_named_two_ways_is_one(
    served_url: str, stores: tuple[Settings, Resources], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``cd alice && index docs``, ``cd bob && index docs --delete-missing``: none of Alice's documents go.
    Alice's folder named by its absolute path is the root she indexed as ``docs``."""
    catalog, kb = Catalog(stores[1].documents.engine), f"roots-{uuid.uuid4().hex[:6]}"
    alice = write_files(tmp_path / "alice" / "docs", {"lamp.md": FOLDER["alpha.md"], "gate.md": FOLDER["beta.md"]})
    bob = write_files(tmp_path / "bob" / "docs", {"hives.md": FOLDER["sub/gamma.md"]})
    monkeypatch.chdir(alice.parent)
    assert index_remote(served_url, kb, Path("docs"))["added"] == 2
    monkeypatch.chdir(bob.parent)
    by_bob = index_remote(served_url, kb, Path("docs"), delete_missing=True)
    assert (by_bob["added"], by_bob["deleted"], by_bob["failed"]) == (1, 0, 0), by_bob
    assert sorted(e.doc_id for e in catalog.documents(kb)) == ["gate.md", "hives.md", "lamp.md"]

    (alice / "gate.md").unlink()
    by_path = index_remote(served_url, kb, alice, delete_missing=True)  # the same folder, named absolutely
    assert (by_path["unchanged"], by_path["deleted"], by_path["failed"]) == (1, 1, 0), by_path
    assert sorted(e.doc_id for e in catalog.documents(kb)) == ["hives.md", "lamp.md"]


def test_a_root_id_names_the_root_and_is_refused_without_a_server(served_url: str, tmp_path: Path) -> None:
    from strata.cli.remote_index import collect_files

    folder = write_files(tmp_path / "docs", {"lamp.md": FOLDER["alpha.md"]})
    assert [u.root for u in collect_files([folder], root_id="team-wiki").uploads] == ["id:team-wiki"]
    assert next(u.root for u in collect_files([folder]).uploads).endswith(f":{folder}")
    local = run_strata(["index", str(folder), "--kb", "x", "--root-id", "team-wiki"], strata_env(tmp_path / "data"))
    assert local.returncode == 2 and "--root-id" in local.stderr and "--server" in local.stderr


def test_a_client_uploads_lists_deletes_and_reads_readiness(connect: Connect, served_url: str, tmp_path: Path) -> None:
    kb = f"cl-{uuid.uuid4().hex[:6]}"
    folder = write_files(tmp_path / "notes", {"alpha.md": FOLDER["alpha.md"]})
    with connect(served_url, "admin-key") as client:
        assert client.index_files(kb, [("alpha.md", folder / "alpha.md")])["added"] == 1
        assert kb in {k["kb_id"] for k in client.list_kbs()}
        assert client.retrieve_documents("when is the alpha lamp lit", 1, kb_ids=[kb]).docs
        client.delete_document(kb, "alpha.md")
        with pytest.raises(NotFoundError):
            client.delete_document(kb, "alpha.md")
        assert client.ready()["status"] in ("ready", "degraded")
