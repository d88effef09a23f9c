"""OpenTelemetry traces of the service: a span per HTTP request, one per retrieval and one per retrieval stage.

Off unless configured: ``STRATA_OTEL__ENABLED=true``, or (the setting unset)
the standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``.
Spans are exported over OTLP/HTTP by the SDK's exporter, which reads the
standard ``OTEL_*`` variables (endpoint, headers, timeout); ``OTEL_SERVICE_NAME``
names the service (default ``strata``). The SDK is the optional extra
``strata-rag[otel]``: without it every function here is a no-op, and
``check_tracing`` stops ``strata serve`` with one line when tracing is asked for.

The retrieval's spans are written when its meta record is complete, from what
its ``RunState`` measured: the ``retrieval`` span runs from the call's start to
its end and carries the record's mode, status, counts and reason codes; each
stage's span ends when the stage reported its outcome and lasts the time the
stage measured, with its own errors, reason codes and counts.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strata.errors import ConfigError

if TYPE_CHECKING:
    from strata.config import Settings
    from strata.types import RetrievalMeta

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
SERVICE_NAME = "strata"
MISSING_EXTRA = (
    "tracing is on (STRATA_OTEL__ENABLED or OTEL_EXPORTER_OTLP_ENDPOINT) but OpenTelemetry is not installed: "
    "pip install 'strata-rag[otel]', or unset them"
)

_provider: Any = None  # the installed TracerProvider; None = tracing off (every function a no-op)
_tracer: Any = None  # its tracer


@dataclass(frozen=True)
class StageTiming:
    """One retrieval stage as a span: its name, when it started and ended (epoch ns) and its attributes."""

    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any] = field(default_factory=dict)


def tracing_enabled(settings: Settings, environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``settings`` (else the OTLP endpoint variables of ``environ``) ask for tracing."""
    if settings.otel.enabled is not None:
        return settings.otel.enabled
    environ = os.environ if environ is None else environ
    return any(environ.get(name) for name in ENDPOINT_VARIABLES)


def check_tracing(settings: Settings) -> None:
    """``ConfigError`` when tracing is asked for and the ``otel`` extra is not installed."""
    if not tracing_enabled(settings):
        return
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ConfigError(MISSING_EXTRA) from None


def start_tracing(settings: Settings) -> Any:
    """Installs a provider exporting over OTLP/HTTP when ``settings`` ask for tracing; returns it (or None)."""
    if not tracing_enabled(settings):
        return None
    check_tracing(settings)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # the resource reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; strata's name only when they give none
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": SERVICE_NAME}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    install(provider)
    return provider


def stop_tracing(provider: Any) -> None:
    """Exports what ``provider`` (from ``start_tracing``) still holds and uninstalls it."""
    if provider is None:
        return
    if _provider is provider:
        install(None)
    provider.shutdown()


def install(provider: Any) -> None:
    """Traces into ``provider`` (an SDK ``TracerProvider``: tests give one with an in-memory exporter); None: off."""
    global _provider, _tracer
    _provider, _tracer = provider, (provider.get_tracer("strata") if provider is not None else None)


def active() -> bool:
    return _tracer is not None


class RequestSpan:
    """The span of one HTTP request; ``finish`` gives it the answer's status."""

    def __init__(self, span: Any = None) -> None:
        self._span = span

    def finish(self, status: int) -> None:
        if self._span is None:
            return
        from opentelemetry.trace import Status, StatusCode

        self._span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self._span.set_status(Status(StatusCode.ERROR))


@contextmanager
def request_span(
    method: str, route: str, path: str, request_id: str, headers: Sequence[tuple[bytes, bytes]]
) -> Iterator[RequestSpan]:
    """The current span while a request is served (a child of its ``traceparent`` header's, if any)."""
    if _tracer is None:
        yield RequestSpan()
        return
    from opentelemetry import propagate, trace

    parent = propagate.extract({name.decode("latin-1"): value.decode("latin-1") for name, value in headers})
    attributes = {"http.request.method": method, "url.path": path, "strata.request_id": request_id}
    if route != "other":
        attributes["http.route"] = route
    name = f"{method} {route}" if route != "other" else method
    with _tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes) as span:
        yield RequestSpan(span)


def record_retrieval(meta: RetrievalMeta, started_ns: int, ended_ns: int, stages: Sequence[StageTiming]) -> None:
    """Writes a finished retrieval's span (under the current span: the request's) and its stages' spans."""
    if _tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = _tracer.start_span("retrieval", start_time=started_ns, attributes=_meta_attributes(meta))
    if meta.status == "failed":
        span.set_status(Status(StatusCode.ERROR, "; ".join(f"{e.stage}: {e.error}" for e in meta.errors)[:200]))
    inside = trace.set_span_in_context(span)
    for stage in stages:
        child = _tracer.start_span(
            f"retrieval.{stage.name}",
            context=inside,
            start_time=max(stage.start_ns, started_ns),
            attributes=dict(stage.attributes),
        )
        child.end(end_time=stage.end_ns)
    span.end(end_time=ended_ns)


def _meta_attributes(meta: RetrievalMeta) -> dict[str, Any]:
    """The meta record's mode, status, counts and reason codes (never the query text)."""
    return {
        "strata.retrieval.mode": meta.mode,
        "strata.retrieval.status": meta.status,
        "strata.retrieval.strategy": meta.strategy,
        "strata.retrieval.cache": meta.cache,
        "strata.retrieval.top_k": meta.top_k,
        "strata.retrieval.candidate_k": meta.candidate_k,
        "strata.retrieval.kb_ids": list(meta.kb_ids or ()),
        "strata.retrieval.dense_candidates": meta.dense_candidates,
        "strata.retrieval.sparse_candidates": meta.sparse_candidates,
        "strata.retrieval.fused_candidates": meta.fused_candidates,
        "strata.retrieval.returned": meta.returned,
        "strata.retrieval.dropped_by_min_score": meta.dropped_by_min_score,
        "strata.retrieval.merge_rounds": len(meta.merge_rounds),
        "strata.retrieval.rerank": meta.rerank.status,
        "strata.retrieval.degraded": list(meta.degraded),
        "strata.retrieval.errors": [e.error for e in meta.errors],
    }
