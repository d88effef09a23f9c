"""Readiness: a status per component (Milvus, SQL, Redis, reranker, encoder), answered without waiting on any.

``/ready`` fails (503) only for what is this pod's own: an encoder running in
the process. Milvus, SQL, Redis, a reranker server and an HTTP encoder are
shared by every replica, so an outage of one would take every pod out of the
Service at once and clients would get "connection refused" instead of strata's
503 problem answer naming the store; a shared component that is down (refused
or hung) makes the answer ``degraded`` (still 200). ``STRATA_API__READY_REQUIRES``
names shared components that should fail it anyway (a single replica behind a
load balancer that can send traffic elsewhere).

A check runs every component at once, each on a thread of its own, and gives
them ``STRATA_API__READY_TIMEOUT_S`` (2 s) together: one that has not answered
by then is ``down`` (hung), and while it still waits no second check of it
starts (a hung store never piles up threads). Probes come every few seconds
from every kubelet, load balancer and monitor: ``Readiness`` answers from the
last check while it is younger than ``STRATA_API__READY_CACHE_S``, and past
that from the last check still, starting a new one in the background; only a
probe with no check before it (the first) waits, at most the bound. So a probe
never waits on a store longer than the bound, however the store hangs.
``public`` is what ``/ready`` shows without a key (a status per component);
the full record (timings, errors, the kb count, the collection, the encoder)
is ``/ready/detail``'s, which waits for a fresh check (again bounded).
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.concurrency import run_in_threadpool

from strata.stores.sql_database import calls_within

if TYPE_CHECKING:
    from strata.api.service import Service

COMPONENTS = ("sql", "milvus", "redis", "reranker", "encoder")
READY_SETTING = "STRATA_API__READY_TIMEOUT_S"
Components = dict[str, dict[str, Any]]
Check = Callable[[], dict[str, Any] | None]


def check_components(service: Service, timeout_s: float | None = None) -> Components:
    """Runs every check now, at once, for at most ``timeout_s`` (default ``STRATA_API__READY_TIMEOUT_S``):
    ``{component: {"status": ok|down|not_configured, "ms", "error"?, details...}}``."""
    return ComponentChecks(service).run(timeout_s or service.settings.api.ready_timeout_s)


def component_checks(service: Service, timeout_s: float) -> dict[str, Check]:
    """Each component's check, its store calls cut at ``timeout_s`` where the store takes a bound per call."""
    checks: dict[str, Callable[[Service, float], dict[str, Any] | None]] = {
        "sql": _sql,
        "milvus": _milvus,
        "redis": _redis,
        "reranker": _reranker,
        "encoder": _encoder,
    }
    return {name: functools.partial(check, service, timeout_s) for name, check in checks.items()}


class ComponentChecks:
    """The checks of one service, each on a thread of its own; a component's check still running from an
    earlier call is waited for again instead of started twice."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._running: dict[str, tuple[float, Future[dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def run(self, timeout_s: float) -> Components:
        """Every component's status within ``timeout_s`` (a component not done by then is ``down``)."""
        futures = {
            name: self._started(name, check) for name, check in component_checks(self._service, timeout_s).items()
        }
        wait_all([future for _, future in futures.values()], timeout=timeout_s)
        return {name: _outcome(started, future, timeout_s) for name, (started, future) in futures.items()}

    def _started(self, name: str, check: Check) -> tuple[float, Future[dict[str, Any]]]:
        with self._lock:
            running = self._running.get(name)
            if running is not None and not running[1].done():
                return running
            future: Future[dict[str, Any]] = Future()
            started = time.perf_counter()
            self._running[name] = (started, future)
        thread = threading.Thread(target=_run, args=(check, started, future), name=f"ready-{name}", daemon=True)
        thread.start()
        return started, future


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
    """The last check of one service: reused for ``cache_s`` seconds, then answered while a new one runs.

    One refresh at a time (an ``asyncio`` task): probes that arrive meanwhile answer from the last check at
    once; the first probe (no check yet) and ``fresh`` callers wait for the refresh, which ends within
    ``timeout_s``. Every finished check sets the service's component gauge (``strata_component_down``).
    """

    def __init__(
        self,
        service: Service,
        *,
        cache_s: float,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._service, self._cache_s, self._clock = service, cache_s, clock
        self.timeout_s = timeout_s or service.settings.api.ready_timeout_s
        self.requires = required(service)
        self._checks = ComponentChecks(service)
        self._refresh: asyncio.Task[_Check] | None = None
        self._refresh_started = 0.0
        self._last: _Check | None = None

    async def components(self, *, fresh: bool = False) -> tuple[Components, float]:
        """The components and the age of their check in seconds; ``fresh`` waits for a check that began
        after this call did (bounded by ``timeout_s``)."""
        asked = self._clock()
        if self._stale(asked, fresh=fresh):
            refresh = self._refreshing(asked)
            if self._last is None or fresh:
                await asyncio.shield(refresh)
        assert self._last is not None
        return self._last.components, self._clock() - self._last.finished

    async def settled(self) -> None:
        """Returns once no refresh is running (tests; a refresh ends within ``timeout_s``)."""
        if self._refresh is not None:
            await asyncio.shield(self._refresh)

    def _refreshing(self, asked: float) -> asyncio.Task[_Check]:
        """The refresh in flight when it began at or after ``asked``, else a new one."""
        refresh = self._refresh
        if refresh is None or refresh.done() or self._refresh_started < asked:
            self._refresh_started = self._clock()
            refresh = self._refresh = asyncio.ensure_future(self._check(self._refresh_started))
        return refresh

    async def _check(self, started: float) -> _Check:
        components = await run_in_threadpool(self._checks.run, self.timeout_s)
        done = _Check(started, self._clock(), components)
        if self._last is None or done.started >= self._last.started:
            self._last = done
        self._service.metrics.observe_components({name: c["status"] == "down" for name, c in components.items()})
        return done

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


def _sql(service: Service, timeout_s: float) -> dict[str, Any]:
    with calls_within(timeout_s, READY_SETTING):  # a pooled or new connection, its ping and the statement
        return {"kbs": len(service.resources.documents.kbs.list_kbs())}


def _milvus(service: Service, timeout_s: float) -> dict[str, Any]:
    # a real call every time (an index opened earlier says nothing of the server now), cut at the
    # search timeout: the collection's metadata, never a count over a kb
    return service.resources.leaf_index.ping()


def _redis(service: Service, timeout_s: float) -> dict[str, Any] | None:
    if not service.settings.redis.url:
        return None
    service.resources.cached_chunks.cache.get_many([("__ready__", "__ready__")])
    return {}


def _reranker(service: Service, timeout_s: float) -> dict[str, Any] | None:
    reranker = service.reranker
    if reranker is None:
        return None
    reranker.rerank("ready", ["ready"], timeout_s=timeout_s)
    return {"name": type(reranker).__name__}


def _encoder(service: Service, timeout_s: float) -> dict[str, Any]:
    encoder = service.resources.encoder
    if encoder.encode_queries(["ready"]).shape[0] != 1:
        raise RuntimeError("the encoder returned no vector for one query")
    return {"name": encoder.name, "dim": encoder.dim}


def _run(check: Check, started: float, future: Future[dict[str, Any]]) -> None:
    try:
        details = check()
    except Exception as exc:
        future.set_result({"status": "down", "error": f"{type(exc).__name__}: {exc}"[:300], "ms": _ms(started)})
        return
    if details is None:
        future.set_result({"status": "not_configured", "ms": _ms(started)})
    else:
        future.set_result({"status": "ok", "ms": _ms(started), **details})


def _outcome(started: float, future: Future[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
    if future.done():
        return future.result()
    waited = time.perf_counter() - started
    return {
        "status": "down",
        "error": f"no answer within {timeout_s:g} s ({READY_SETTING}); still waiting after {waited:.1f} s: hung?",
        "ms": _ms(started),
    }


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
