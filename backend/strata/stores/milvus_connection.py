"""Connecting to Milvus: a client with the options its kind of server needs, and the Milvus Lite file lock.

``connect`` gives a client of its own and whether the other end is Milvus Lite
(a ``.db`` file, or a ``milvus-lite server``). A Lite file another process holds
is refused as ``IndexLockedError``, naming what to do instead.
"""

from __future__ import annotations

import fcntl
import os
from typing import Any

from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from strata.config import MilvusSettings
from strata.errors import IndexLockedError, StoreError
from strata.stores.store_timeouts import Bound, is_grpc_deadline, timed_out

_CONNECT_FAILED = 2  # pymilvus's code for a channel not ready within the client's timeout

# Milvus Lite's gRPC server (in this process for a ``.db`` file, or a ``milvus-lite server``) keeps grpc's
# default ping policy and answers pymilvus's 10 s keepalive pings with GOAWAY "too_many_pings", which fails
# the call in flight; loopback needs no keepalive. Milvus standalone permits them: it keeps pymilvus's.
_NO_KEEPALIVE = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}
# After each refused connection grpc waits longer before it tries again (1 s, x1.6, up to 120 s): under steady
# queries, a server back from a 10 s outage was tried again only 5-7 s after it answered, and every query
# failed meanwhile. pymilvus's recovery (a new channel on UNAVAILABLE) did not help: by default the new
# channel takes the same waiting connection from grpc's process-wide subchannel pool. A pool of the
# channel's own makes that new channel try at once, and a 1 s cap bounds the wait of the channel itself.
_RECONNECT = {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": 250,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def milvus_client(settings: MilvusSettings) -> MilvusClient:
    """A client of the configured Milvus with the connection options its kind of server needs."""
    return connect(settings)[0]


def connect(settings: MilvusSettings) -> tuple[MilvusClient, bool]:
    """The client (``milvus_client``) and whether the other end is Milvus Lite: a ``.db`` file, or a
    ``milvus-lite server`` (its version says so; asked once, here).

    The connection is the client's own, closed with it: pymilvus would otherwise share one channel per
    address, made with the options of whichever client came first, and keep it after its last client
    closed. A Milvus Lite file's server gets a new loopback port each time a process opens it, so a kept
    channel to a port a released server had, reused when a later server gets that port, fails with
    "connection refused" (seen in the test suite)."""
    uri = str(settings.uri)
    if settings.is_lite:
        os.makedirs(os.path.dirname(os.path.abspath(uri)), exist_ok=True)
        return _client(settings, dedicated=True, grpc_options=_NO_KEEPALIVE | _RECONNECT), True
    client = _client(settings, dedicated=True, grpc_options=_RECONNECT)
    try:
        lite_server = str(client.get_server_version(timeout=settings.timeout_s)).startswith("milvus_lite")
    except MilvusException as exc:
        client.close()
        raise _connect_error(settings, exc) from exc
    if not lite_server:
        return client, False
    client.close()
    return _client(settings, dedicated=True, grpc_options=_NO_KEEPALIVE | _RECONNECT), True


def _connect_error(settings: MilvusSettings, exc: MilvusException) -> StoreError:
    """A failed connection to a server: no channel within the client's timeout (refused or hung) names the
    setting."""
    uri = str(settings.uri)
    if not settings.is_lite and (exc.code == _CONNECT_FAILED or is_grpc_deadline(exc)):
        return timed_out(
            "Milvus", "a new connection", Bound(settings.timeout_s, "STRATA_MILVUS__TIMEOUT_S"), address=uri
        )
    return StoreError(f"cannot connect to Milvus at {uri}: {exc}")


def _client(settings: MilvusSettings, **options: Any) -> MilvusClient:
    uri = str(settings.uri)
    try:
        return MilvusClient(uri=uri, token=settings.token.get_secret_value(), timeout=settings.timeout_s, **options)
    except MilvusException as exc:
        if settings.is_lite and not _lite_served_here(uri) and _lite_file_locked(uri):
            raise IndexLockedError(
                f"the Milvus Lite file {uri} is open in another process (a running `strata serve`, `strata index`, "
                "`strata eval` or a service calling retrieve_documents?). Milvus Lite allows one process per file: "
                "when it is `strata serve`, index through it with `strata index PATH --kb NAME --server "
                "http://127.0.0.1:8080`; otherwise stop that process first, or use a Milvus server "
                "(STRATA_MILVUS__URI=http://host:19530)."
            ) from exc
        raise _connect_error(settings, exc) from exc


def _lite_served_here(uri: str) -> bool:
    """Whether this process serves the Milvus Lite file (its own lock is then no other process's)."""
    try:
        from milvus_lite import server_manager_instance
    except ImportError:
        return False
    return os.path.abspath(uri) in getattr(server_manager_instance, "_servers", {})


def _lite_file_locked(uri: str) -> bool:
    lock_path = os.path.join(os.path.abspath(uri), "LOCK")
    if not os.path.exists(lock_path):
        return False
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
