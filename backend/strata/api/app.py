"""The app factory: ``create_app(settings)`` builds the FastAPI app of strata's service.

The lifespan builds the engine parts once (or takes the caller's
``Resources``), warms them with one query so the first request does not pay
for loading the encoder and jieba's dictionary, and closes them on shutdown.
The keys are read when the app is built, so a key that could never match
stops the service before it starts.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute

from strata.api import openapi, problems
from strata.api.auth import KeyRing
from strata.api.connections import CLOSED_CONNECTIONS
from strata.api.deps import needs_key
from strata.api.metrics import Metrics
from strata.api.middleware import Authenticate, BodyLimit, ConcurrencyLimit, RequestContext
from strata.api.readiness import Readiness
from strata.api.routes import health, kbs, retrieve, ui
from strata.api.service import Service
from strata.api.shared_slots import slots_from_environment
from strata.api.upload_limit import UploadLimit
from strata.api.uploads import remove_orphaned_folders
from strata.config import Settings, get_settings
from strata.resources import Resources
from strata.tracing import start_tracing, stop_tracing

logger = logging.getLogger(__name__)


def create_app(
    settings: Settings, *, resources: Resources | None = None, warm_up: bool = True, keys: KeyRing | None = None
) -> FastAPI:
    """The service for ``settings``; with ``resources`` it shares them (and leaves closing them to the caller).

    With ``resources``, pass the settings they were built with, changed only in the service's own sections
    (``api``, tracing): the engine answers with ``resources.settings`` (stores, retrieval, query cache), so another
    ``retrieval`` section here would apply to the service's checks and not to its answers.

    ``keys`` are the settings' keys when not given; raises ``ConfigError`` for a key that could never match.
    """
    metrics = Metrics()
    keys = keys if keys is not None else KeyRing.from_settings(settings.api)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        owns = resources is None
        tracer_provider = start_tracing(settings)  # in each worker process: the exporter's thread is its own
        service = Service(settings, resources or Resources(settings), owns_resources=owns, metrics=metrics, keys=keys)
        app.state.service = service
        app.state.readiness = Readiness(service, cache_s=settings.api.ready_cache_s)
        await run_in_threadpool(remove_orphaned_folders)  # a worker killed mid-upload left its folder behind
        if warm_up:
            await run_in_threadpool(service.warm_up)
        logger.info("strata service ready (%s)", "API keys required" if service.keys.enabled else "no API keys")
        try:
            yield {CLOSED_CONNECTIONS: metrics.connections_closed}  # lifespan state: the connections count here
        finally:
            service.close()
            stop_tracing(tracer_provider)
            logger.info("strata service stopped")

    app = FastAPI(
        title="strata",
        summary="Hierarchical RAG retrieval over Milvus: evidence plus a meta record",
        version="0.1.0",
        lifespan=lifespan,
        docs_url="/docs" if settings.api.docs else None,  # Swagger UI and ReDoc load their scripts from a CDN
        redoc_url="/redoc" if settings.api.docs else None,
    )
    routers = (health.router, retrieve.router, kbs.router, ui.router)
    for router in routers:
        app.include_router(router)
    routes = [route for router in routers for route in router.routes]  # route templates label the metrics
    protected = [route for route in routes if needs_key(route)]
    # the protected routes are FastAPI's (they have dependencies); only an APIRoute has methods
    keyed = [
        (route.path_format, method)
        for route in protected
        if isinstance(route, APIRoute)
        for method in route.methods or ()
    ]

    def complete_openapi() -> dict[str, Any]:
        return app.openapi_schema or openapi.complete(FastAPI.openapi(app), settings.retrieval, keyed)

    app.openapi = complete_openapi  # type: ignore[method-assign]  # FastAPI's way to extend the schema
    problems.install(app, request_id_header=settings.api.request_id_header, routes=routes)
    api = settings.api
    app.add_middleware(  # inside ConcurrencyLimit: an upload holds a request slot, then an upload slot
        UploadLimit,
        per_key=api.max_uploads_per_key,
        total=api.max_uploads,
        slots=slots_from_environment(),
        metrics=metrics,
    )
    app.add_middleware(
        ConcurrencyLimit,
        limit=api.max_concurrency,
        per_key=api.key_concurrency,
        wait_s=api.queue_timeout_s,
        metrics=metrics,
    )
    app.add_middleware(BodyLimit, max_bytes=api.max_upload_bytes, timeout_s=api.body_timeout_s, metrics=metrics)
    app.add_middleware(Authenticate, keys=keys, protected=protected)
    app.add_middleware(RequestContext, metrics=metrics, header=api.request_id_header, routes=lambda: routes)
    return app


def app_from_environment() -> FastAPI:
    """For ``uvicorn --factory`` (one app per worker process): the settings of the environment."""
    return create_app(get_settings())
