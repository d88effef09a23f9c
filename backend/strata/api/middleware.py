"""ASGI middleware: request ids and access logs, the concurrency limit, the body-size limit.

Plain ASGI (not ``BaseHTTPMiddleware``) so streaming bodies and timings stay
exact and nothing is buffered twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from typing import Any, Callable

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strata.api.metrics import Metrics
from strata.api.problems import problem_response

access_log = logging.getLogger("strata.api.access")

UNLIMITED_PATHS = frozenset({"/health", "/ready", "/metrics"})
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestContext:
    """Gives each request an id (echoed in a header), logs it, and counts it per route."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics, header: str, routes: Callable[[], list[Any]]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes
        self.header = header.lower().encode("latin-1")
        self.header_name = header

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = self._request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        route = self._route(scope)
        started = time.perf_counter()
        status = 500
        gauge = self.metrics.in_progress.labels(route)
        gauge.inc()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (self.header, request_id.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            gauge.dec()
            seconds = time.perf_counter() - started
            self.metrics.observe_request(route, scope["method"], status, seconds)
            access_log.info(json.dumps({
                "request_id": request_id, "method": scope["method"], "path": scope["path"], "route": route,
                "status": status, "ms": round(seconds * 1000, 2), "client": (scope.get("client") or ("", 0))[0],
            }))  # fmt: skip

    def _request_id(self, scope: Scope) -> str:
        for name, value in scope.get("headers", []):
            if name == self.header:
                given = value.decode("latin-1")
                if _SANE_REQUEST_ID.match(given):
                    return given
        return uuid.uuid4().hex

    def _route(self, scope: Scope) -> str:
        for route in self.routes():
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return str(getattr(route, "path", "other"))
        return "other"


class ConcurrencyLimit:
    """At most ``limit`` requests at once; others wait up to ``wait_s``, then get a 503 with Retry-After."""

    def __init__(self, app: ASGIApp, *, limit: int, wait_s: float, metrics: Metrics) -> None:
        self.app, self.wait_s, self.metrics = app, wait_s, metrics
        self.limit = limit
        self._slots: asyncio.Semaphore | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNLIMITED_PATHS:
            return await self.app(scope, receive, send)
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.limit)  # created inside the server's event loop
        if not await self._acquire(self._slots):
            self.metrics.rejected.labels("concurrency").inc()
            response = problem_response(
                503, f"the service is busy ({self.limit} requests in progress); retry shortly",
                request_id=scope.get("state", {}).get("request_id"), title="Service Busy", headers={"Retry-After": "1"},
            )  # fmt: skip
            return await response(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()

    async def _acquire(self, slots: asyncio.Semaphore) -> bool:
        if not slots.locked():  # a free slot is taken at once (wait_for with timeout 0 would refuse it)
            await slots.acquire()
            return True
        try:
            await asyncio.wait_for(slots.acquire(), timeout=self.wait_s)
        except asyncio.TimeoutError:
            return False
        return True


class BodyLimit:
    """Refuses bodies over ``max_bytes`` with a 413, by Content-Length or by counting a chunked stream."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, metrics: Metrics) -> None:
        self.app, self.max_bytes, self.metrics = app, max_bytes, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await self._too_large(scope, receive, send)
        seen = 0
        exceeded = False
        started = False

        async def counting_receive() -> Message:
            nonlocal seen, exceeded
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    exceeded = True
                    return {"type": "http.disconnect"}  # the app stops reading; its answer is replaced below
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded:
                if not started and message["type"] == "http.response.start":
                    started = True
                    await self._too_large(scope, receive, send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await self._too_large(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.metrics.rejected.labels("body_size").inc()
        response = problem_response(
            413, f"the request body exceeds {self.max_bytes} bytes", request_id=scope.get("state", {}).get("request_id"),
            title="Content Too Large",
        )  # fmt: skip
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
