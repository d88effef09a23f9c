"""ASGI middleware: request ids, access logs and request spans, the key check, the body limits, the concurrency limit.

Plain ASGI (not ``BaseHTTPMiddleware``) so streaming bodies and timings stay
exact and nothing is buffered twice. The order (outermost first) is the order
a request meets them: ``RequestContext``, ``Authenticate`` (from the headers,
before anything reads the body), ``BodyLimit`` (size and time), then
``ConcurrencyLimit``, which counts authenticated requests only, so a client
without a key can never hold a slot, and gives one key at most its share of
the slots. The body's clock starts in ``BodyLimit``, before the slot is taken,
so a sender trickling its body holds a slot until the body timeout at most.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strata.api.auth import CHALLENGE, OPEN, UNAUTHORIZED, KeyRing, Principal, bearer_token
from strata.api.metrics import Metrics
from strata.api.problems import logged_problem_response
from strata.api.shared_slots import shared_from_environment
from strata.api.slots import KeySlots
from strata.logs import ACCESS, REQUEST_ID
from strata.tracing import request_span

access_log = logging.getLogger("strata.api.access")

UNLIMITED_PATHS = frozenset({"/health", "/ready", "/ready/detail", "/metrics"})
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


class RequestContext:
    """Gives each request an id (echoed in a header and set in ``strata.logs.REQUEST_ID`` for every record logged
    while it is served), logs it, counts it per route and traces it (``strata.tracing``).

    The context variable is not reset afterwards: uvicorn serves each request in a task of its own (a copy of
    the context), and the error handler Starlette runs outside every middleware logs under the request's id.
    """

    def __init__(self, app: ASGIApp, *, metrics: Metrics, header: str, routes: Callable[[], list[Any]]) -> None:
        self.app, self.metrics, self.routes = app, metrics, routes
        self.header = header.lower().encode("latin-1")
        self.header_name = header

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = self._request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        REQUEST_ID.set(request_id)
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

        with request_span(scope["method"], route, scope["path"], request_id, scope.get("headers", [])) as span:
            try:
                await self.app(scope, receive, send_with_id)
            finally:
                gauge.dec()
                seconds = time.perf_counter() - started
                self.metrics.observe_request(route, scope["method"], status, seconds)
                span.finish(status)
                fields = {
                    "request_id": request_id,
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "ms": round(seconds * 1000, 2),
                    "client": (scope.get("client") or ("", 0))[0],
                }
                access_log.info(json.dumps(fields), extra={ACCESS: fields})

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


class Authenticate:
    """Puts the caller's ``Principal`` in the request state; a route needing a key answers 401 without one.

    Only the headers are read, so a client without a valid key is refused before
    it sends its body. Without configured keys every request is ``OPEN``.
    """

    def __init__(self, app: ASGIApp, *, keys: KeyRing, protected: Sequence[BaseRoute]) -> None:
        self.app, self.keys, self.protected = app, keys, protected

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        principal = self._principal(scope)
        if principal is not None:
            scope.setdefault("state", {})["principal"] = principal
        elif any(route.matches(scope)[0] == Match.FULL for route in self.protected):
            # a body still on its way is not read: the connection closes after the answer
            headers = {**CHALLENGE, "Connection": "close"} if _declares_body(scope) else CHALLENGE
            response = logged_problem_response(
                401,
                UNAUTHORIZED,
                request_id=scope.get("state", {}).get("request_id"),
                title="Unauthorized",
                headers=headers,
            )
            return await response(scope, receive, send)
        await self.app(scope, receive, send)

    def _principal(self, scope: Scope) -> Principal | None:
        if not self.keys.enabled:
            return OPEN
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                token = bearer_token(value.decode("latin-1"))
                return self.keys.lookup(token) if token else None
        return None


def principal_of(scope: Scope) -> Principal | None:
    """The caller ``Authenticate`` found, or None."""
    return scope.get("state", {}).get("principal")


class ConcurrencyLimit:
    """At most ``limit`` authenticated requests at once, at most ``per_key`` of them from one key; others wait up
    to ``wait_s``, then get a 503 with Retry-After.

    Requests without a principal (public routes without a key) and the operations endpoints are not counted.
    Without configured keys every request is ``OPEN`` and only the total applies.
    """

    def __init__(self, app: ASGIApp, *, limit: int, per_key: int, wait_s: float, metrics: Metrics) -> None:
        self.app, self.wait_s, self.metrics = app, wait_s, metrics
        self.limit, self.per_key = limit, per_key
        self._slots: KeySlots | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = principal_of(scope) if scope["type"] == "http" else None
        if principal is None or scope["path"] in UNLIMITED_PATHS:
            return await self.app(scope, receive, send)
        if self._slots is None:
            # futures belong to the server's event loop; a key's share holds across workers (shared_slots)
            self._slots = KeySlots(self.limit, self.per_key, shared_from_environment())
        key = None if principal == OPEN else principal  # the principal, never the key's text
        if not await self._slots.acquire(key, self.wait_s):
            return await self._refuse(self._slots.at_share(key), scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release(key)

    async def _refuse(self, at_share: bool, scope: Scope, receive: Receive, send: Send) -> None:
        self.metrics.rejected.labels("key_concurrency" if at_share else "concurrency").inc()
        detail = (
            f"this key has its share of the service ({self.per_key} requests) in progress; retry shortly"
            if at_share
            else f"the service is busy ({self.limit} requests in progress); retry shortly"
        )
        response = logged_problem_response(
            503,
            detail,
            request_id=scope.get("state", {}).get("request_id"),
            title="Service Busy",
            headers={"Retry-After": "1"},
        )
        await response(scope, receive, send)


class BodyLimit:
    """Refuses a body over ``max_bytes`` (413, by Content-Length or by counting a chunked stream) and one still
    arriving ``timeout_s`` after the request's headers (408), so a slow sender cannot keep a slot.

    The clock starts here, before ``ConcurrencyLimit`` takes a slot: time spent queued counts, so a body
    trickled while its request waited cannot start a fresh ``timeout_s`` once it holds a slot.
    """

    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_s: float, metrics: Metrics) -> None:
        self.app, self.max_bytes, self.timeout_s, self.metrics = app, max_bytes, timeout_s, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            return await self._refuse(413, scope, receive, send)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        body = _BodyWatch(receive, max_bytes=self.max_bytes, deadline=deadline)
        started = False

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if body.refusal is not None:
                if not started and message["type"] == "http.response.start":
                    started = True
                    await self._refuse(body.refusal, scope, receive, send)
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, body.receive, guarded_send)
        except Exception:
            if body.refusal is None:
                raise
        if body.refusal is not None and not started:
            await self._refuse(body.refusal, scope, receive, send)

    async def _refuse(self, status: int, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = scope.get("state", {}).get("request_id")
        if status == 413:
            self.metrics.rejected.labels("body_size").inc()
            detail = f"the request body exceeds {self.max_bytes} bytes"
            response = logged_problem_response(413, detail, request_id=request_id, title="Content Too Large")
        else:  # the client is still sending: close the connection rather than read the rest
            self.metrics.rejected.labels("body_timeout").inc()
            response = logged_problem_response(
                408,
                f"the request body did not arrive within {self.timeout_s:g} s",
                request_id=request_id,
                title="Request Timeout",
                headers={"Connection": "close"},
            )
        await response(scope, receive, send)


class _BodyWatch:
    """The app's ``receive`` for one request: counts the body and refuses it once the loop time passes ``deadline``.

    A refused body reads as a disconnect (the app stops reading); ``refusal`` says why (413 or 408).
    Once the body is complete, ``receive`` is the server's own (waiting for a disconnect has no deadline).
    """

    def __init__(self, receive: Receive, *, max_bytes: int, deadline: float) -> None:
        self._receive, self.max_bytes, self._deadline = receive, max_bytes, deadline
        self.refusal: int | None = None
        self._seen = 0
        self._complete = False

    async def receive(self) -> Message:
        if self.refusal is not None:
            return {"type": "http.disconnect"}
        if self._complete:
            return await self._receive()
        left = self._deadline - asyncio.get_running_loop().time()
        try:
            message = await asyncio.wait_for(self._receive(), timeout=max(left, 0.0))
        except TimeoutError:
            return self._refuse(408)
        if message["type"] == "http.request":
            self._seen += len(message.get("body", b""))
            self._complete = not message.get("more_body", False)
            if self._seen > self.max_bytes:
                return self._refuse(413)
        return message

    def _refuse(self, status: int) -> Message:
        self.refusal = status
        return {"type": "http.disconnect"}


def _declares_body(scope: Scope) -> bool:
    chunked = any(name == b"transfer-encoding" for name, _ in scope.get("headers", []))
    return chunked or bool(_content_length(scope))


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
