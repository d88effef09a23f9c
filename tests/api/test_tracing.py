"""OpenTelemetry traces: a span per request, a ``retrieval`` span with the meta record, a span per stage.

The spans of a real app over the real stores go to the SDK's in-memory exporter;
the OTLP/HTTP export is checked against a local HTTP server standing in for a
collector (it records what it is sent), on when the standard endpoint variable is
set and off when ``STRATA_OTEL__ENABLED=false`` says so.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from strata import tracing
from strata.api import create_app
from strata.cli import main
from strata.config import Settings
from strata.errors import ConfigError
from strata.resources import Resources

GARDEN_QUERY = "how often do tomatoes need deep watering"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    yield exporter
    tracing.install(None)
    provider.shutdown()


def test_a_retrieve_request_gives_request_retrieval_and_stage_spans(
    open_client: TestClient, spans: InMemorySpanExporter
) -> None:
    query = f"{GARDEN_QUERY} {uuid.uuid4().hex}"  # not in the query cache
    response = open_client.post("/retrieve", json={"query": query, "kb_ids": ["garden"], "top_k": 3})
    assert response.status_code == 200
    meta = response.json()["meta"]
    finished = spans.get_finished_spans()
    [request] = [s for s in finished if s.name == "POST /retrieve"]
    assert request.attributes["http.route"] == "/retrieve" and request.attributes["http.response.status_code"] == 200
    assert request.attributes["strata.request_id"] == response.headers["X-Request-ID"]

    [retrieval] = [s for s in finished if s.name == "retrieval"]
    assert retrieval.parent is not None and retrieval.parent.span_id == request.context.span_id
    attributes = retrieval.attributes
    assert (attributes["strata.retrieval.mode"], attributes["strata.retrieval.status"]) == (
        meta["mode"],
        meta["status"],
    )
    assert (attributes["strata.retrieval.returned"], attributes["strata.retrieval.fused_candidates"]) == (
        len(response.json()["docs"]),
        meta["fused_candidates"],
    )
    assert list(attributes["strata.retrieval.degraded"]) == meta["degraded"]
    assert meta["returned"] > 0 and meta["cache"] != "hit"

    stages = [s for s in finished if s.name.startswith("retrieval.")]
    assert all(s.parent is not None and s.parent.span_id == retrieval.context.span_id for s in stages)
    assert all(retrieval.start_time <= s.start_time <= s.end_time <= retrieval.end_time for s in stages)
    [search] = [s for s in stages if s.name == "retrieval.search" and "strata.stage.mode" in s.attributes]
    assert search.attributes["strata.stage.mode"] == meta["mode"]
    assert search.attributes["strata.stage.dense"] == meta["dense_candidates"]
    assert search.attributes["strata.stage.sparse"] == meta["sparse_candidates"]
    assert {"retrieval.state", "retrieval.encode", "retrieval.search"} <= {s.name for s in stages}
    assert not [s for s in finished if query in str(dict(s.attributes or {}))], "a span carries the query text"


def test_a_failed_retrieval_span_carries_the_reasons(open_client: TestClient, spans: InMemorySpanExporter) -> None:
    response = open_client.post("/retrieve", json={"query": GARDEN_QUERY, "kb_ids": ["no-such-kb"]})
    assert response.status_code == 404
    finished = {s.name: s for s in spans.get_finished_spans()}
    retrieval = finished["retrieval"]
    assert (retrieval.attributes["strata.retrieval.status"], retrieval.attributes["strata.retrieval.mode"]) == (
        "failed",
        "failed",
    )
    assert list(retrieval.attributes["strata.retrieval.degraded"]) == ["unknown_kb"]
    assert list(finished["retrieval.kb"].attributes["strata.stage.errors"]) == ["NotFoundError"]
    assert finished["POST /retrieve"].attributes["http.response.status_code"] == 404


class Collector:
    """A local OTLP/HTTP endpoint: keeps the span names of every export it is sent."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.span_names: list[str] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                collector.paths.append(self.path)
                collector.span_names += [
                    s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans
                ]
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    served = Collector()
    yield served
    served.close()


def _serve_one_retrieval(settings: Settings, resources: Resources) -> bool:
    """A retrieval through an app of ``settings``; whether tracing was on while it ran. The app's shutdown
    exports what its spans' batch still holds."""
    with TestClient(create_app(settings, resources=resources, warm_up=False)) as client:
        on = tracing.active()
        assert client.post("/retrieve", json={"query": GARDEN_QUERY, "kb_ids": ["garden"]}).status_code == 200
    assert not tracing.active()  # the app's shutdown uninstalled its provider
    return on


def test_the_otlp_endpoint_variable_exports_over_http(
    stores: tuple[Settings, Resources], collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, resources = stores
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    assert _serve_one_retrieval(settings, resources)
    assert collector.paths and set(collector.paths) == {"/v1/traces"}
    assert {"POST /retrieve", "retrieval", "retrieval.search"} <= set(collector.span_names)


def test_tracing_switched_off_exports_nothing(
    stores: tuple[Settings, Resources], collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings, resources = stores
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.url)
    off = settings.model_copy(update={"otel": settings.otel.model_copy(update={"enabled": False})})
    assert not _serve_one_retrieval(off, resources)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    assert not _serve_one_retrieval(settings, resources)  # nothing asks for it: off by default
    assert collector.paths == []


def test_tracing_asked_for_without_the_extra_stops_serve_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # import fails, as without the extra
    monkeypatch.chdir(tmp_path)
    for name in [n for n in os.environ if n.startswith("STRATA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("STRATA_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("STRATA_OTEL__ENABLED", "true")
    from strata.config import get_settings

    get_settings.cache_clear()
    try:
        assert main(["serve", "--port", "1"]) == 2
    finally:
        get_settings.cache_clear()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and tracing.MISSING_EXTRA in err
    with pytest.raises(ConfigError, match="strata-rag\\[otel\\]"):
        tracing.check_tracing(Settings(_env_file=None, otel={"enabled": True}))
