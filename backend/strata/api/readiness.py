"""Readiness: a status per component (Milvus, SQL, Redis, reranker, encoder).

``/ready`` fails (503) only for what is this pod's own: an encoder running in
the process. Milvus, SQL, Redis, a reranker server and an HTTP encoder are
shared by every replica, so an outage of one would take every pod out of the
Service at once and clients would get "connection refused" instead of strata's
503 problem answer naming the store; a shared component that is down makes the
answer ``degraded`` (still 200). ``STRATA_API__READY_REQUIRES`` names shared
components that should fail it anyway (a single replica behind a load balancer
that can send traffic elsewhere).

Probes come every few seconds from every kubelet, load balancer and monitor,
so ``Readiness`` keeps the last check for ``STRATA_API__READY_CACHE_S`` and
concurrent callers wait for the one check in flight. ``public`` is what
``/ready`` shows without a key (a status per component); the full record
(timings, errors, the kb count, the collection, the encoder) is ``/ready/detail``'s.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.concurrency import run_in_threadpool

if TYPE_CHECKING:
    from strata.api.service import Service

COMPONENTS = ("sql", "milvus", "redis", "reranker", "encoder")
Components = dict[str, dict[str, Any]]


def check_components(service: Service) -> Components:
    """Runs every check now: ``{component: {"status": ok|down|not_configured, "ms", "error"?, details...}}``."""
    checks: dict[str, Callable[[Service], dict[str, Any] | None]] = {
        "sql": _sql,
        "milvus": _milvus,
        "redis": _redis,
        "reranker": _reranker,
        "encoder": _encoder,
    }
    return {name: _timed(functools.partial(check, service)) for name, check in checks.items()}


def required(service: Service) -> frozenset[str]:
    """The components whose failure makes this pod unready: its own (an in-process encoder) and the
    shared ones ``STRATA_API__READY_REQUIRES`` names."""
    own = {"encoder"} if service.settings.embedding.provider != "openai" else set()
    return frozenset(own | set(service.settings.api.ready_requires))


def overall(components: Components, requires: frozenset[str]) -> tuple[str, int]:
    """``ready``/``degraded`` (200) or ``unavailable`` (503: a component of ``requires`` is down)."""
    if any(components[name]["status"] == "down" for name in requires):
        return "unavailable", 503
    if any(c["status"] == "down" for c in components.values()):
        return "degraded", 200
    return "ready", 200


def public(components: Components) -> Components:
    """Only the status of each component: no error text, address, kb or model name for a caller without a key."""
    return {name: {"status": c["status"]} for name, c in components.items()}


class Readiness:
    """The last ``check_components`` of one service, reused for ``cache_s`` seconds.

    An ``asyncio.Lock`` rather than a thread cache: callers waiting for the check in flight hold
    no worker thread, and they all get its outcome (one check however many probes arrive).
    """

    def __init__(self, service: Service, *, cache_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._service, self._cache_s, self._clock = service, cache_s, clock
        self.requires = required(service)
        self._lock = asyncio.Lock()
        self._last: _Check | None = None

    async def components(self, *, fresh: bool = False) -> tuple[Components, float]:
        """The components and the age of their check in seconds; ``fresh`` checks again unless a check
        began after this call did."""
        asked = self._clock()
        async with self._lock:
            if self._stale(asked, fresh=fresh):
                started = self._clock()
                components = await run_in_threadpool(check_components, self._service)
                self._last = _Check(started, self._clock(), components)
            assert self._last is not None
            return self._last.components, self._clock() - self._last.finished

    def _stale(self, asked: float, *, fresh: bool) -> bool:
        last = self._last
        if last is None:
            return True
        if last.started >= asked:  # began while this caller waited: as new as a check of its own
            return False
        return fresh or self._clock() - last.finished >= self._cache_s


@dataclass(frozen=True)
class _Check:
    started: float
    finished: float
    components: Components


def _sql(service: Service) -> dict[str, Any]:
    return {"kbs": len(service.resources.documents.kbs.list_kbs())}


def _milvus(service: Service) -> dict[str, Any]:
    # a real call every time (an index opened earlier says nothing of the server now), cut at the
    # search timeout: the collection's metadata, never a count over a kb
    return service.resources.leaf_index.ping()


def _redis(service: Service) -> dict[str, Any] | None:
    if not service.settings.redis.url:
        return None
    service.resources.cached_chunks.cache.get_many([("__ready__", "__ready__")])
    return {}


def _reranker(service: Service) -> dict[str, Any] | None:
    reranker = service.reranker
    if reranker is None:
        return None
    reranker.rerank("ready", ["ready"])
    return {"name": type(reranker).__name__}


def _encoder(service: Service) -> dict[str, Any]:
    encoder = service.resources.encoder
    if encoder.encode_queries(["ready"]).shape[0] != 1:
        raise RuntimeError("the encoder returned no vector for one query")
    return {"name": encoder.name, "dim": encoder.dim}


def _timed(check: Callable[[], dict[str, Any] | None]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        details = check()
    except Exception as exc:
        return {"status": "down", "error": f"{type(exc).__name__}: {exc}"[:300], "ms": _ms(started)}
    if details is None:
        return {"status": "not_configured", "ms": _ms(started)}
    return {"status": "ok", "ms": _ms(started), **details}


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
