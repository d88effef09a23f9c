"""``strata serve --workers N`` as teams share it: a process of its own on a Milvus server, PostgreSQL and Redis.

Tests that attack the service as a tenant would (hostile uploads, trickling bodies, idle sockets, metrics across
workers) start one with ``shared_service(...)``: two tenants with a read and a write key each, a read-all key, a
metrics key and a full-access key. The service is a real process answering on loopback; nothing in the test process
shares its state.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.processes import start_serve, stop_process, strata_env
from tests.support.stores import REDIS_URL

TENANT_A_READ = "tenant-a-read-key-0123456789"
TENANT_A_WRITE = "tenant-a-write-key-0123456789"
TENANT_B_READ = "tenant-b-read-key-0123456789"
TENANT_B_WRITE = "tenant-b-write-key-0123456789"
READ_ALL = "read-all-key-0123456789abcdef"
METRICS = "metrics-scrape-key-0123456789"
ADMIN = "full-access-admin-key-0123456789"

KEYS: dict[str, dict[str, Any]] = {
    TENANT_A_READ: {"kbs": ["alpha"]},
    TENANT_A_WRITE: {"kbs": ["alpha"], "write": True},
    TENANT_B_READ: {"kbs": ["beta"]},
    TENANT_B_WRITE: {"kbs": ["beta"], "write": True},
    READ_ALL: {"kbs": ["*"]},
    METRICS: {"kbs": [], "metrics": True},
    ADMIN: {"kbs": ["*"], "write": True},
}

SEED = {
    "alpha": {"alpha.md": "# Lighthouse\n\nThe keeper polishes the Fresnel lens every Tuesday at dawn.\n"},
    "beta": {"beta.md": "# Bakery\n\nThe sourdough starter is fed with rye flour at six in the evening.\n"},
}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@dataclass
class SharedService:
    """A running ``strata serve``: its URL, environment, process and log file."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    env: dict[str, str]
    log: Path
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(120.0, connect=5.0))

    def wait_ready(self, within_s: float = 240.0) -> None:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"strata serve exited {self.process.returncode}: {self.log_text()[-3000:]}")
            try:
                if self.http.get("/ready").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)  # polling a starting process, bounded by the deadline
        raise AssertionError(f"strata serve did not become ready: {self.log_text()[-3000:]}")

    def upload(self, kb: str, files: Mapping[str, str | bytes], key: str = ADMIN, **params: Any) -> httpx.Response:
        sent = [("files", (name, body.encode() if isinstance(body, str) else body)) for name, body in files.items()]
        return self.http.post(f"/kbs/{kb}/documents", files=sent, params=params, headers=auth(key))

    def retrieve(self, query: str, kb: str, key: str, **body: Any) -> httpx.Response:
        return self.http.post("/retrieve", json={"query": query, "top_k": 3, "kb_ids": [kb], **body}, headers=auth(key))

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""

    def close(self) -> None:
        self.http.close()
        stop_process(self.process, grace_s=30)


@contextmanager
def shared_service(
    root: Path, milvus_uri: str, pg_url: str, *, workers: int = 2, seed: bool = True, **variables: str
) -> Iterator[SharedService]:
    """A ``strata serve --workers N`` over ``milvus_uri``'s collection of its own, ``pg_url`` and the shared Redis.

    ``variables`` are more ``STRATA_*`` settings (``STRATA_API__MAX_CONCURRENCY="4"``). With ``seed`` the kbs
    ``alpha`` (tenant A) and ``beta`` (tenant B) hold one document each.
    """
    root.mkdir(parents=True, exist_ok=True)
    suffix = uuid.uuid4().hex[:8]
    env = strata_env(
        root / "data",
        STRATA_LOG_LEVEL="INFO",
        STRATA_MILVUS__URI=milvus_uri,
        STRATA_MILVUS__COLLECTION=f"shared_{suffix}",
        STRATA_DATABASE__URL=pg_url,
        STRATA_REDIS__URL=REDIS_URL,
        STRATA_REDIS__KEY_PREFIX=f"strata-shared-{suffix}",
        STRATA_API__KEYS=json.dumps(KEYS),
        STRATA_API__SHUTDOWN_GRACE_S="10",
        **variables,
    )
    log = root / f"serve-{suffix}.log"
    with log.open("wb") as out:
        process, url = start_serve(
            env, "--workers", str(workers), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    service = SharedService(process, url, int(url.rsplit(":", 1)[1]), env, log)
    try:
        service.wait_ready()
        if seed:
            for kb, files in SEED.items():
                answer = service.upload(kb, files)
                assert answer.status_code == 200, answer.text
        yield service
    finally:
        service.close()


def signal_group(service: SharedService, signum: int = signal.SIGKILL) -> None:
    """Sends ``signum`` to the service and its workers (they share its process group)."""
    with suppress(ProcessLookupError):
        os.killpg(service.process.pid, signum)
