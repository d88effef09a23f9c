"""Tier 2, one host and several processes, each a process of its own as a user runs them.

``strata serve --workers 2``, a ``strata index`` of another kb and ``strata query``
share one local Milvus server (the session's ``milvus-lite server``, in a
collection of this test's own) and one SQL store (SQLite beside the data, the
default; and PostgreSQL); the per-kb lease keeps a second indexer of the kb out.
``strata milvus-server`` starts such a server.

Nothing waits a fixed time: every wait polls a condition under a deadline.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
import uvicorn
from sqlalchemy import create_engine, select

from strata.cli.serve import _tcp_listener
from strata.stores.sql_schema import kb_leases
from tests.support.documents import write_files
from tests.support.milvus import milvus_answers, server_collection
from tests.support.paths import REPO
from tests.support.processes import STRATA, free_port, run_strata, strata_env
from tests.support.stores import fresh_pg_database

pytestmark = [pytest.mark.slow, pytest.mark.cost(55)]  # several strata processes at once

T = TypeVar("T")

KEY = "several-processes-test-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
NOTES = {
    "lighthouse.md": (
        "# Lighthouse\n\nThe keeper polishes the Fresnel lens every Tuesday at dawn "
        "and writes it in the brass ledger.\n"
    ),
    "bakery.md": "# Bakery\n\nThe sourdough starter is fed with rye flour at six in the evening.\n",
}
ORCHARD = "# Orchard\n\nThe pear trees of the north orchard are pruned in February, before the sap rises.\n"
LOGBOOKS = 2  # x 60 leaves; the indexer is stopped (SIGSTOP) while the processes alongside it run


def logbook(book: int, entries: int = 60) -> str:
    lines = [f"# Logbook {book}", ""]
    for n in range(entries):
        lines += [
            f"## Entry {n}",
            "",
            f"Day {n} of book {book}: the tide rose {n % 7} metres, wind from bearing "
            f"{n * 13 % 360}, {n * 3 % 11} ships passed and the lamp used {n * 17 % 50} litres of oil.",
            "",
        ]
    return "\n".join(lines)


def wait_until(condition: Callable[[], T], *, within_s: float, what: str) -> T:
    """Polls ``condition`` until it returns something true; fails after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)  # the pause between polls; the deadline bounds the wait
    raise AssertionError(f"{what} did not happen within {within_s:.0f} s")


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Every process a test starts; whatever still runs at the end is killed."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(30)


def spawn(
    processes: list[subprocess.Popen[str]], args: Sequence[str], env: dict[str, str], **streams: object
) -> subprocess.Popen[str]:
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **streams}
    process = subprocess.Popen([str(STRATA), *args], env=env, cwd=REPO, text=True, **pipes)  # type: ignore[call-overload]
    processes.append(process)
    return process


@pytest.fixture(params=["sqlite", "postgresql"])
def database_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """SQLite beside the data (what a user gets without STRATA_DATABASE__URL), or a fresh PostgreSQL database
    (``strata db upgrade`` first, as its operator would)."""
    if request.param == "sqlite":
        yield {}
        return
    with fresh_pg_database() as url:
        yield {"STRATA_DATABASE__URL": url}


@pytest.mark.slow
@pytest.mark.milvus_server
def test_serve_index_and_query_run_at_once_on_a_milvus_server(
    tmp_path: Path, milvus_server_uri: str, database_env: dict[str, str], processes: list[subprocess.Popen[str]]
) -> None:
    with server_collection(milvus_server_uri, "strata_procs") as target:
        data = tmp_path / "data"
        env = strata_env(
            data,
            **target.env(),
            **database_env,
            STRATA_API__KEYS=json.dumps({KEY: {"kbs": ["a", "b"]}}),
            STRATA_RETRIEVAL__CACHE_SIZE="0",
            STRATA_INDEXING__LEASE_TTL_S="900",  # the indexer keeps its lease while it is stopped below
        )
        database_url = database_env.get("STRATA_DATABASE__URL", f"sqlite:///{data / 'strata.sqlite3'}")
        if database_env:  # its operator migrates PostgreSQL once (SQLite upgrades itself)
            done = run_strata(["db", "upgrade"], env)
            assert done.returncode == 0, done.stderr
        done = run_strata(["index", str(write_files(tmp_path / "a", NOTES)), "--kb", "a"], env)
        assert done.returncode == 0, done.stderr

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with (tmp_path / "serve.log").open("w") as log:
            serve = spawn(
                processes, ["serve", "--workers", "2", "--port", str(port)], env, stdout=log, stderr=subprocess.STDOUT
            )
        wait_until(
            lambda: _ready(serve, url, tmp_path / "serve.log"), within_s=300, what="strata serve --workers 2 ready"
        )
        assert httpx.post(f"{url}/retrieve", json={"query": "lens", "top_k": 1, "kb_ids": ["a"]}).status_code == 401

        books = write_files(
            tmp_path / "b", {"orchard.md": ORCHARD, **{f"log{n}.md": logbook(n) for n in range(LOGBOOKS)}}
        )
        indexer = spawn(processes, ["index", str(books), "--kb", "b"], env)
        holder = wait_until(
            lambda: _lease_owner(database_url, "b", indexer), within_s=300, what="the indexer taking kb b's lease"
        )
        assert f"pid {indexer.pid}:" in holder
        indexer.send_signal(signal.SIGSTOP)  # mid-run, holding the lease, for as long as the others take

        # while it indexes kb b: a second indexer of b, a CLI query of a, and the service's answers for a
        second = spawn(processes, ["index", str(books), "--kb", "b"], env)
        query = spawn(
            processes, ["query", "When is the Fresnel lens polished?", "--kb", "a", "--top-k", "1", "--json"], env
        )
        answers = []
        while second.poll() is None or query.poll() is None:
            answers.append(_retrieve(url, "When is the Fresnel lens polished?", "a"))
        second_out, second_err = second.communicate(timeout=120)
        query_out, query_err = query.communicate(timeout=120)
        assert indexer.poll() is None, "kb b's indexer ended while it was stopped"
        indexer.send_signal(signal.SIGCONT)

        assert second.returncode == 1 and "LeaseHeldError" in second_err, second_out + second_err
        assert f"knowledge base 'b' is being indexed by {holder}" in second_err
        assert query.returncode == 0, query_err
        assert json.loads(query_out)["docs"][0]["metadata"]["doc_id"] == "lighthouse.md"
        assert answers and all(doc_id == "lighthouse.md" for doc_id in answers), answers

        index_out, index_err = indexer.communicate(timeout=900)
        assert indexer.returncode == 0 and f"{LOGBOOKS + 1} added" in index_out, index_out + index_err
        assert _lease_owner(database_url, "b", indexer) is None, "the lease is given back at the end of the run"

        # the service, started before kb b existed, answers for it (new connections: either worker)
        found = [_retrieve(url, "When are the pear trees pruned?", "b") for _ in range(6)]
        assert found == ["orchard.md"] * 6

        serve.send_signal(signal.SIGTERM)
        assert serve.wait(120) == 0, (tmp_path / "serve.log").read_text()[-3000:]


def _ready(serve: subprocess.Popen[str], url: str, log: Path) -> bool:
    assert serve.poll() is None, f"strata serve exited {serve.returncode}: {log.read_text()[-3000:]}"
    try:
        return httpx.get(f"{url}/ready", headers=AUTH, timeout=10).status_code == 200
    except httpx.TransportError:
        return False


def _lease_owner(database_url: str, kb_id: str, indexer: subprocess.Popen[str]) -> str | None:
    """Who holds ``kb_id``'s indexing lease, read straight from SQL (None: nobody)."""
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            owner = conn.execute(select(kb_leases.c.owner).where(kb_leases.c.kb_id == kb_id)).scalar()
    finally:
        engine.dispose()
    if owner is None:
        assert indexer.poll() in (None, 0), f"the indexer failed: {indexer.communicate()}"
    return owner


def _retrieve(url: str, query: str, kb_id: str) -> str:
    """The top document's id of one ``POST /retrieve`` on a new connection (either worker may take it)."""
    response = httpx.post(
        f"{url}/retrieve", json={"query": query, "top_k": 1, "kb_ids": [kb_id]}, headers=AUTH, timeout=120
    )
    assert response.status_code == 200, response.text
    return response.json()["docs"][0]["metadata"]["doc_id"]


def test_milvus_server_command_runs_milvus_lites_server(tmp_path: Path, processes: list[subprocess.Popen[str]]) -> None:
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = spawn(
        processes, ["milvus-server", "--data-dir", str(tmp_path / "milvus"), "--port", str(port)], strata_env(tmp_path)
    )
    wait_until(lambda: _answers(server, uri), within_s=120, what="the server answering")
    # the command became milvus-lite's server (same process, bound to loopback), it does not run beside it
    assert "milvus_lite" in Path(f"/proc/{server.pid}/cmdline").read_text().replace("\0", " ")
    server.terminate()
    out, _ = server.communicate(timeout=60)
    assert out.splitlines()[0] == f"export STRATA_MILVUS__URI={uri}"
    assert (tmp_path / "milvus").is_dir()


def test_milvus_server_refuses_a_port_another_server_listens_on(tmp_path: Path) -> None:
    """milvus-lite's server binds beside another with SO_REUSEPORT and would take half its clients silently."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as a gRPC server binds
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = run_strata(
            ["milvus-server", "--data-dir", str(tmp_path / "milvus"), "--port", str(port)], strata_env(tmp_path)
        )
    assert done.returncode == 2 and f"port {port} on 127.0.0.1 is already in use" in done.stderr, done.stderr
    assert done.stdout == "" and not (tmp_path / "milvus").exists()


def _answers(server: subprocess.Popen[str], uri: str) -> bool:
    assert server.poll() is None, f"strata milvus-server exited {server.returncode}: {server.communicate()}"
    return milvus_answers(uri)


def test_the_workers_connections_get_tcp_nodelay() -> None:
    """The socket ``--workers N`` hands its workers: their connections have Nagle off (else ~40 ms per response)."""
    listener = _tcp_listener(
        uvicorn.Config("strata.api.app:app_from_environment", host="127.0.0.1", port=0, log_config=None)
    )

    async def accepted_nodelay() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.set_result(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname())
        try:
            return await asyncio.wait_for(accepted, 10)
        finally:
            writer.close()
            server.close()

    assert asyncio.run(accepted_nodelay()) != 0
