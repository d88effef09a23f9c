"""Milvus for the tests: where a test's leaves live (``MilvusTarget``), server collections, a server process.

Every suite that writes leaves runs on a Milvus Lite file and on a Milvus server; the fixtures of
tests/conftest.py parametrise over ``MILVUS_TARGETS``, ``LEVEL_TARGETS`` and ``EACH_LEVEL_TARGETS``.
``MILVUS_SERVER_RUN`` is the one record of the session's server: the ``milvus_server_uri`` fixture fills
it and the hooks of tests/conftest.py report it. ``MilvusServerProcess.start`` looks ``milvus_answers``
up in this module when it polls (tests/faults replace it here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from strata.cli.milvus_server import port_taken, server_command
from strata.config import MilvusSettings
from tests.support.processes import free_port, stop_process

T = TypeVar("T")


class MilvusServerProcess:
    """A ``milvus-lite server`` process (the gRPC server milvus-lite ships) on a free loopback port.

    pymilvus talks to it as to Milvus standalone; tests/faults stop and restart one of their own.
    """

    def __init__(self, data_dir: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self._port_given = port is not None  # a restart keeps its port; a port of its own is chosen again if taken
        self.port = port or free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, within_s: float = 60.0) -> None:
        # another test's server on this port would share it (SO_REUSEPORT) and answer some of this one's clients
        if port_taken("127.0.0.1", self.port):
            if self._port_given:
                raise RuntimeError(f"port {self.port} is in use: this server would share it with another")
            self.port = free_port()
            self.uri = f"http://127.0.0.1:{self.port}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            server_command(self.data_dir, host="127.0.0.1", port=self.port),  # what `strata milvus-server` runs
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


def milvus_answers(uri: str, token: str = "") -> bool:
    import grpc
    from pymilvus.exceptions import MilvusException

    from strata.errors import StoreError
    from strata.stores.milvus_connection import milvus_client

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


MILVUS_SERVER_RUN: dict[str, str] = {}  # what the session's server was, for the terminal summary


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
    from strata.stores.milvus_connection import milvus_client

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
def fresh_collection(uri: str, prefix: str) -> Iterator[MilvusSettings]:
    """Settings of a new collection on the server (isolation auto: the kb id is the partition key), dropped after."""
    with server_collection(uri, prefix) as target:
        yield MilvusSettings(uri=target.uri, collection=target.collection, token=target.token)


def settled(read: Callable[[], T], done: Callable[[T], bool], *, within_s: float = 30.0) -> T:
    """``read()`` until ``done`` holds or ``within_s`` passed; returns the last answer for the caller to assert.

    For reads at Bounded consistency (searches): a server may answer without rows flushed a moment
    ago (for up to its graceful time, 5 s by default). Counts are Strong and need no settling
    (``test_a_strong_count_right_after_a_flush_is_exact``).
    """
    deadline = time.monotonic() + within_s
    while True:
        answer = read()
        if done(answer) or time.monotonic() >= deadline:
            return answer
        time.sleep(0.5)
