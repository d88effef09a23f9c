"""A Milvus server for the ``milvus_server`` tests: the partition-key layout and the server code paths.

The server is, in order: ``STRATA_TEST_MILVUS_URI`` (an existing Milvus, e.g. a CI service), or a
Milvus standalone started with testcontainers from the image ``deploy/compose.yml`` pins (needs a
Docker engine). Without either the tests are skipped with a reason that starts ``milvus_server:``,
which ``.ci/run`` counts. Each test gets a collection of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import contextmanager
from typing import Callable, Iterator, TypeVar

import pytest
import yaml
from pymilvus import MilvusClient

from strata.config import MilvusSettings
from tests.conftest import REPO

COMPOSE = REPO / "deploy" / "compose.yml"
T = TypeVar("T")


def milvus_image() -> str:
    """The Milvus image of deploy/compose.yml: the tests run the version that is deployed."""
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"]["milvus"]["image"]


def docker_unavailable() -> str | None:
    """Why no container can be started here, or None."""
    try:
        import docker
        from testcontainers.community.milvus import MilvusContainer  # noqa: F401
    except ImportError as exc:
        return f"testcontainers is not installed ({exc.name}); pip install -e '.[dev]'"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as exc:  # docker.errors.DockerException and the transport's errors
        return f"no Docker engine reachable ({type(exc).__name__})"
    return None


@pytest.fixture(scope="session")
def milvus_server_uri() -> Iterator[str]:
    given = os.environ.get("STRATA_TEST_MILVUS_URI")
    if given:
        yield given
        return
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"milvus_server: {reason} and STRATA_TEST_MILVUS_URI is unset; these tests need a Milvus server")
    from testcontainers.community.milvus import MilvusContainer

    with MilvusContainer(milvus_image()) as container:
        yield container.get_connection_url()


@contextmanager
def fresh_collection(uri: str, prefix: str) -> Iterator[MilvusSettings]:
    """Settings of a new collection on the server (kb_layout auto: the kb id is the partition key), dropped after."""
    settings = MilvusSettings(uri=uri, collection=f"{prefix}_{uuid.uuid4().hex[:12]}")
    try:
        yield settings
    finally:
        client = MilvusClient(uri=uri)
        try:
            if client.has_collection(settings.collection):
                client.drop_collection(settings.collection)
        finally:
            client.close()


@pytest.fixture
def server_milvus(milvus_server_uri: str) -> Iterator[MilvusSettings]:
    """A fresh collection on the server for one test."""
    with fresh_collection(milvus_server_uri, "strata_test") as settings:
        yield settings


def settled(read: Callable[[], T], done: Callable[[T], bool], *, within_s: float = 30.0) -> T:
    """``read()`` until ``done`` holds or ``within_s`` passed; returns the last answer for the caller to assert.

    strata keeps pymilvus's default Bounded consistency: a server may answer a read without rows
    flushed a moment ago (for up to its graceful time, 5 s by default). The tests assert what the
    server settles on, not how fast it gets there.
    """
    deadline = time.monotonic() + within_s
    while True:
        answer = read()
        if done(answer) or time.monotonic() >= deadline:
            return answer
        time.sleep(0.5)
