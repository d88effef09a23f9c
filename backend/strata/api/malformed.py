"""The answer to a request the HTTP server cannot parse: a problem document, as every other error answer is.

uvicorn answers a request line or header h11 refuses (a path of raw non-ASCII bytes, a header without a colon)
with a text/plain 400 before any application code runs. ``ProblemBadRequest`` is mixed into strata's h11
protocol (``strata.api.connections.BoundedH11Protocol``) so that answer is ``application/problem+json`` too,
with the same status, the same ``Connection: close`` and no request id (no request was read).
"""

from __future__ import annotations

import json
from typing import Any

import h11

from strata.api.problems import MEDIA_TYPE, TYPE_BASE

MALFORMED = TYPE_BASE + "malformed-request"


def malformed_request_body(message: str) -> bytes:
    """The problem document of a request the server could not parse."""
    problem = {"type": MALFORMED, "title": "Bad Request", "status": 400, "detail": message, "request_id": None}
    return json.dumps(problem).encode()


class ProblemBadRequest:
    """Overrides uvicorn's ``H11Protocol.send_400_response`` (0.54: a text/plain body) with a problem document."""

    conn: h11.Connection
    transport: Any

    def send_400_response(self, msg: str) -> None:
        body = malformed_request_body(
            f"the request could not be parsed: {msg} Send a valid HTTP/1.1 request, with its path percent-encoded"
        )
        headers = [
            (b"content-type", MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request")))
        self.transport.write(self.conn.send(h11.Data(data=body)))
