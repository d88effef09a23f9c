"""Prometheus metrics of one app (a registry of its own, so apps never share counters).

Every label takes its values from a fixed set (route templates, the HTTP methods
below, statuses, modes, reasons), never from what a client sends: no client can
add series, and no kb name or other tenant detail appears in a label.
"""

from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE

from strata.types import RetrievalResult

__all__ = ["CONTENT_TYPE", "Metrics"]

HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # others count as "other"
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)


class Metrics:
    """Requests and latencies per route, retrieval modes, degraded reasons, cache hits, encoder latency."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("strata_http_requests", "HTTP requests answered", ["route", "method", "status"], registry=r)
        self.latency = Histogram(
            "strata_http_request_duration_seconds", "HTTP request latency", ["route", "method"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.in_progress = Gauge("strata_http_requests_in_progress", "requests being served", ["route"], registry=r)
        self.rejected = Counter("strata_http_requests_rejected", "requests refused by a limit", ["reason"], registry=r)
        self.retrievals = Counter("strata_retrievals", "retrievals by mode and status", ["mode", "status"], registry=r)
        self.degraded = Counter("strata_retrieval_degraded", "degraded retrievals by reason", ["reason"], registry=r)
        self.cache = Counter("strata_query_cache", "query-cache lookups by outcome", ["outcome"], registry=r)
        self.cache_hit_ratio = Gauge("strata_query_cache_hit_ratio", "query-cache hits / (hits + misses)", registry=r)
        self.encoder_latency = Histogram(
            "strata_encoder_seconds", "query encoding latency", buckets=_LATENCY_BUCKETS, registry=r
        )
        self._lock = threading.Lock()
        self._hits = self._lookups = 0

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
        if meta.cache in ("hit", "miss"):
            with self._lock:
                self._lookups += 1
                self._hits += meta.cache == "hit"
                self.cache_hit_ratio.set(self._hits / self._lookups)
        encode_ms = meta.timings_ms.get("encode")
        if encode_ms is not None and meta.cache != "hit":
            self.encoder_latency.observe(encode_ms / 1000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
