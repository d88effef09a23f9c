"""Uploads are parse work, and parse work is a shared, bounded resource: a key's uploads count against its share
service-wide.

An upload parses every file it sends in a child process that takes a whole CPU while it runs (a 400 KB page
of docutils targets once took 54 s), then encodes and writes. A key may run at most
``STRATA_API__MAX_UPLOADS_PER_KEY`` uploads at once across every worker of the service (the slots are
``shared_slots``': ``--workers N`` does not multiply them), and the service at most
``STRATA_API__MAX_UPLOADS`` (when set) in all. One more is refused at once, before its body is read: 429 for
the key's share, 503 for the service's, each with ``Retry-After`` (an upload lasts seconds to minutes: waiting
in a queue would hold a connection and a request slot for that long). A service without keys has no shares,
only the total.

The slot is taken when the request reaches this middleware, before the app reads the body, so an upload whose
body is still arriving holds it too (within ``STRATA_API__BODY_TIMEOUT_S``): a client that sends
``Expect: 100-continue`` is told to send its body once it holds the slot.
"""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Receive, Scope, Send

from strata.api.auth import OPEN
from strata.api.metrics import Metrics
from strata.api.middleware import principal_of
from strata.api.problems import problem_response
from strata.api.shared_slots import Held, Slots
from strata.api.slots import group_of

UPLOAD_PATH = re.compile(r"^/kbs/[^/]+/documents/?$")
RETRY_AFTER_S = 5
TOTAL_GROUP = "uploads"


class UploadLimit:
    """At most ``per_key`` uploads of one key and ``total`` (None: no bound) of the service at once."""

    def __init__(self, app: ASGIApp, *, per_key: int, total: int | None, slots: Slots, metrics: Metrics) -> None:
        self.app, self.per_key, self.total, self.slots, self.metrics = app, per_key, total, slots, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        principal = principal_of(scope) if scope["type"] == "http" else None
        if principal is None or scope["method"] != "POST" or not UPLOAD_PATH.match(scope["path"]):
            return await self.app(scope, receive, send)
        held: list[Held] = []
        try:
            if principal != OPEN:
                mine = self.slots.take(f"upload-{group_of(principal)}", self.per_key)
                if mine is None:
                    return await self._refuse(429, scope, receive, send)
                held.append(mine)
            if self.total is not None:
                theirs = self.slots.take(TOTAL_GROUP, self.total)
                if theirs is None:
                    return await self._refuse(503, scope, receive, send)
                held.append(theirs)
            await self.app(scope, receive, send)
        finally:
            for slot in reversed(held):
                self.slots.release(slot)

    async def _refuse(self, status: int, scope: Scope, receive: Receive, send: Send) -> None:
        if status == 429:
            self.metrics.rejected.labels("key_uploads").inc()
            detail = (
                f"this key has its share of uploads ({self.per_key}, STRATA_API__MAX_UPLOADS_PER_KEY) in progress; "
                "retry after one ends"
            )
        else:
            self.metrics.rejected.labels("uploads").inc()
            detail = f"the service runs {self.total} uploads (STRATA_API__MAX_UPLOADS) already; retry shortly"
        headers = {"Retry-After": str(RETRY_AFTER_S), "Connection": "close"}  # its body is not read
        title = "Too Many Requests" if status == 429 else "Service Busy"
        response = problem_response(
            status, detail, request_id=scope.get("state", {}).get("request_id"), title=title, headers=headers
        )
        await response(scope, receive, send)
