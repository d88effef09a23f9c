"""Errors as RFC 9457 problem documents (``type``, ``title``, ``status``, ``detail``).

Every error the service answers carries the request id. Routes raise
``Problem``; the handlers here turn it, FastAPI's validation errors and
anything unexpected into ``application/problem+json``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from strata.errors import StoreError

logger = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://strata.dev/problems/"


class Problem(Exception):
    """An error answer: status, a short title, a detail for people and extra members."""

    def __init__(
        self, status: int, detail: str, *, title: str | None = None, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title or HTTPStatus(status).phrase
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra


def problem_response(
    status: int, detail: str, *, request_id: str | None, title: str | None = None,
    headers: dict[str, str] | None = None, **extra: Any,
) -> JSONResponse:  # fmt: skip
    title = title or HTTPStatus(status).phrase
    body = {
        "type": TYPE_BASE + title.lower().replace(" ", "-"), "title": title, "status": status,
        "detail": detail, "request_id": request_id, **extra,
    }  # fmt: skip
    return JSONResponse(body, status_code=status, headers=headers, media_type=MEDIA_TYPE)


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def install(app: FastAPI) -> None:
    """Registers the handlers that turn every error into a problem document."""
    app.add_exception_handler(Problem, _problem)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(StoreError, _store)
    app.add_exception_handler(Exception, _unexpected)


async def _problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    return problem_response(
        exc.status, exc.detail, request_id=request_id_of(request), title=exc.title, headers=exc.headers, **exc.extra
    )


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]
    detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
    return problem_response(422, detail, request_id=request_id_of(request), title="Invalid Input", errors=errors)


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return problem_response(
        exc.status_code, str(exc.detail), request_id=request_id_of(request), headers=dict(exc.headers or {})
    )


async def _store(request: Request, exc: Exception) -> JSONResponse:
    logger.warning("store unavailable (request %s): %s", request_id_of(request), exc)
    return problem_response(
        503, f"a store is unavailable: {type(exc).__name__}", request_id=request_id_of(request),
        headers={"Retry-After": "5"},
    )  # fmt: skip


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error (request %s)", request_id_of(request))
    return problem_response(500, "internal error; the request id is in the service log", request_id=request_id_of(request))
