"""Prometheus metrics of the service, right whichever worker answers a scrape.

One process (``strata serve``, an app built in a test): each app has a registry
of its own, so apps never share counters. Several workers (``strata serve
--workers N``): prometheus_client's multiprocess mode. Before the workers
start, ``multiprocess_dir`` points ``PROMETHEUS_MULTIPROC_DIR`` at a private
temporary directory (or empties the one the operator set); each worker then
writes its values to files there, and a scrape, whichever worker answers it,
adds up the files of every worker, those that exited included, so a counter
never goes back. A worker's live gauge (requests in progress) leaves with it
(``retire_worker``, called by the supervisor).

The query-cache hit ratio is computed at each scrape from the lookup counter
(hits / (hits + misses) over the service's life, NaN before the first lookup):
a gauge set by each worker could not be added up across workers.

Every label takes its values from a fixed set (route templates, the HTTP methods
below, statuses, modes, reasons), never from what a client sends: no client can
add series, and no kb name or other tenant detail appears in a label.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from strata.types import RetrievalResult

__all__ = ["CONTENT_TYPE", "MULTIPROC_DIR", "Metrics", "multiprocess_dir", "retire_worker"]

logger = logging.getLogger(__name__)

MULTIPROC_DIR = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's variable: where the workers' values meet
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # others count as "other"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
_HIT_RATIO = "strata_query_cache_hit_ratio"


class Metrics:
    """Requests and latencies per route, retrieval modes, degraded reasons, cache hits, encoder latency."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "strata_http_requests", "HTTP requests answered", ["route", "method", "status"], registry=r
        )
        self.latency = Histogram(
            "strata_http_request_duration_seconds",
            "HTTP request latency",
            ["route", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_progress = Gauge(
            "strata_http_requests_in_progress",
            "requests being served",
            ["route"],
            registry=r,
            multiprocess_mode="livesum",  # across workers: the sum over the live ones
        )
        self.rejected = Counter("strata_http_requests_rejected", "requests refused by a limit", ["reason"], registry=r)
        self.connections_closed = Counter(
            "strata_http_connections_closed",
            "connections the server closed to stay within its limits",
            ["reason"],
            registry=r,
        )
        self.retrievals = Counter("strata_retrievals", "retrievals by mode and status", ["mode", "status"], registry=r)
        self.degraded = Counter("strata_retrieval_degraded", "degraded retrievals by reason", ["reason"], registry=r)
        self.cache = Counter("strata_query_cache", "query-cache lookups by outcome", ["outcome"], registry=r)
        self.encoder_latency = Histogram(
            "strata_encoder_seconds", "query encoding latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.component_down = Gauge(
            "strata_component_down",
            "1 while the last readiness check found the component down (refused or hung), else 0",
            ["component"],
            registry=r,
            multiprocess_mode="livemax",  # across workers: down when any live worker's last check says so
        )
        self._scrape = _scrape_registry(r)

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        method = method if method in HTTP_METHODS else "other"
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)

    def observe_retrieval(self, result: RetrievalResult) -> None:
        meta = result.meta
        self.retrievals.labels(meta.mode, meta.status).inc()
        for reason in meta.degraded:
            self.degraded.labels(reason).inc()
        self.cache.labels(meta.cache).inc()
        encode_ms = meta.timings_ms.get("encode")
        if encode_ms is not None and meta.cache != "hit":
            self.encoder_latency.observe(encode_ms / 1000)

    def observe_components(self, down: dict[str, bool]) -> None:
        """The outcome of a readiness check: whether each component (a fixed name) was down."""
        for component, is_down in down.items():
            self.component_down.labels(component).set(1 if is_down else 0)

    def render(self) -> bytes:
        return generate_latest(self._scrape)


def multiprocess_mode() -> bool:
    """Whether prometheus_client keeps values in ``PROMETHEUS_MULTIPROC_DIR`` (it decides when first imported)."""
    return values.ValueClass is not values.MutexValue


def _scrape_registry(own: CollectorRegistry) -> CollectorRegistry:
    """What a scrape reads: this app's registry, or in multiprocess mode every worker's files."""
    source: Any = MultiProcessCollector(None) if multiprocess_mode() else own
    scrape = CollectorRegistry(auto_describe=False)
    scrape.register(_WithHitRatio(source))
    return scrape


class _WithHitRatio:
    """A collector: ``source``'s metrics, then the query-cache hit ratio computed from their lookup counter."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        outcomes: dict[str, float] = {"hit": 0.0, "miss": 0.0}
        for family in self._source.collect():
            if family.name == "strata_query_cache":
                for sample in family.samples:
                    outcome = sample.labels.get("outcome")
                    if sample.name == "strata_query_cache_total" and outcome in outcomes:
                        outcomes[outcome] += sample.value
            yield family
        lookups = outcomes["hit"] + outcomes["miss"]
        ratio = outcomes["hit"] / lookups if lookups else float("nan")
        yield GaugeMetricFamily(_HIT_RATIO, "query-cache hits / (hits + misses) since the service started", value=ratio)


@contextmanager
def multiprocess_dir(workers: int) -> Iterator[Path | None]:
    """Where the workers' metrics meet for one run of the service, set before any worker creates a metric.

    ``PROMETHEUS_MULTIPROC_DIR`` as the operator set it, emptied of an earlier run's files (one directory per
    service); else, with several workers, a private temporary directory, removed at exit. None: one process
    without the variable, whose app keeps its own registry.
    """
    given = os.environ.get(MULTIPROC_DIR)
    if given:
        path = Path(given)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):  # an earlier run's counts would be added to this run's
            stale.unlink()
        yield path
        return
    if workers == 1:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="strata-metrics-"))  # mode 0700: the service's own
    os.environ[MULTIPROC_DIR] = str(path)  # the workers inherit it, and import prometheus_client after
    logger.info("metrics of %d workers are kept in %s", workers, path)
    try:
        yield path
    finally:
        os.environ.pop(MULTIPROC_DIR, None)
        shutil.rmtree(path, ignore_errors=True)


def retire_worker(pid: int) -> None:
    """A worker has exited: its live gauges leave the scrape; its counters stay (they count what happened)."""
    path = os.environ.get(MULTIPROC_DIR)
    if path:
        mark_process_dead(pid, path)
