"""Errors as RFC 9457 problem documents (``type``, ``title``, ``status``, ``detail``).

Every error the service answers carries the request id, in the body and in
the header. ``ERROR_TABLE`` is the one place where an exception of strata's
tree becomes an answer: its problem type, title, status and Retry-After, and
whether its message may be shown to the caller (a 5xx of the service's own
keeps its cause in the log). Routes raise strata's errors, or ``Problem`` for
a refusal of their own (a key that may not write); the handlers here turn
those, FastAPI's validation errors, a method the path does not have and
anything unexpected into ``application/problem+json``.

Each answer is logged once, under the request's id (``strata.logs``): a client's
error (4xx) at INFO, the service's (5xx) at ERROR. No line quotes the request's
body: the query text is the user's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match

from strata.errors import (
    CacheError,
    ConfigError,
    DeadlineExceeded,
    DeleteRefusedError,
    EncoderError,
    EncoderMismatchError,
    IndexingError,
    IndexingStoppedError,
    IndexLockedError,
    InvalidArgumentError,
    KeyGrantError,
    LeaseHeldError,
    LeaseLostError,
    LeavesMissingError,
    LoaderError,
    NotFoundError,
    RerankError,
    ServiceError,
    StoreError,
    StoreTimeoutError,
    StrataError,
    UnsupportedAnalyzer,
)

logger = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://strata.dev/problems/"
RETRY_S = 5  # a store, the encoder or the reranker down: worth trying again soon
_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


@dataclass(frozen=True)
class Refusal:
    """How the service answers one kind of error.

    ``detail`` words the answer from the exception (default: its message); a ``private`` refusal shows a fixed
    sentence instead, for errors whose message names the service's hosts, files or settings.
    """

    slug: str
    title: str
    status: int
    retry_after_s: int | None = None
    private: bool = False
    detail: Callable[[Any], str] | None = None

    def detail_of(self, exc: Exception) -> str:
        if self.detail is not None:
            return self.detail(exc)
        if self.private:
            return f"{self.title.lower()}; the service log has the cause under this request id"
        return str(exc)

    def headers_of(self, exc: Exception) -> dict[str, str]:
        seconds = getattr(exc, "retry_after_s", None) or self.retry_after_s
        return {"Retry-After": str(math.ceil(seconds))} if seconds else {}


def _lease_detail(exc: LeaseHeldError) -> str:
    # the holder's host and pid are the operator's business (they are logged), not the caller's
    return (
        f"knowledge base {exc.kb_id!r} is being written by another request or indexer; send this again once it "
        "has finished (Retry-After: when its lease could next be free)"
    )


def _lost_detail(exc: LeaseLostError) -> str:
    return (
        f"this upload lost the lease of knowledge base {exc.kb_id!r} to another writer while it worked (it was "
        "paused past the lease): it stopped before its next write and nothing it left unfinished serves; send it again"
    )


def _store_timeout_detail(exc: StoreTimeoutError) -> str:
    # the store and the bound that ended the wait, never its address (logged under the request id)
    return f"{exc.store} did not answer within {exc.timeout_s:.3g} s ({exc.setting}); send this again shortly"


def _stopped_detail(exc: IndexingStoppedError) -> str:
    return f"{exc}; send the files again once it is back"


INVALID_INPUT = Refusal("invalid-input", "Invalid Input", 422)

# Most specific class first: the first row the exception is an instance of answers it.
ERROR_TABLE: tuple[tuple[type[StrataError], Refusal], ...] = (
    (LeaseLostError, Refusal("lease-lost", "Lease Lost", 409, RETRY_S, detail=_lost_detail)),
    (LeaseHeldError, Refusal("kb-being-written", "Knowledge Base Busy", 409, RETRY_S, detail=_lease_detail)),
    # the request is valid but conflicts with what the kb holds; the same request never passes (no Retry-After)
    (DeleteRefusedError, Refusal("delete-refused", "Deletion Refused", 409)),  # the message names the count
    (EncoderMismatchError, Refusal("encoder-mismatch", "Encoder Mismatch", 409)),
    (LeavesMissingError, Refusal("leaves-missing", "Leaves Missing", 503)),  # the message names the repair
    (IndexLockedError, Refusal("index-locked", "Index Locked", 503, RETRY_S, private=True)),
    (CacheError, Refusal("cache-unavailable", "Cache Unavailable", 503, RETRY_S, private=True)),
    (StoreTimeoutError, Refusal("store-timeout", "Store Timeout", 503, RETRY_S, detail=_store_timeout_detail)),
    (StoreError, Refusal("store-unavailable", "Store Unavailable", 503, RETRY_S, private=True)),
    (IndexingStoppedError, Refusal("indexing-stopped", "Indexing Stopped", 503, RETRY_S, detail=_stopped_detail)),
    (IndexingError, Refusal("indexing-failed", "Indexing Failed", 500, private=True)),
    (LoaderError, Refusal("unreadable-document", "Unreadable Document", 422)),
    (NotFoundError, Refusal("not-found", "Not Found", 404)),
    (InvalidArgumentError, INVALID_INPUT),
    (DeadlineExceeded, Refusal("deadline-exceeded", "Deadline Exceeded", 504)),
    (RerankError, Refusal("rerank-failed", "Rerank Failed", 502, RETRY_S, private=True)),
    (EncoderError, Refusal("encoder-unavailable", "Encoder Unavailable", 503, RETRY_S, private=True)),
    (UnsupportedAnalyzer, Refusal("unsupported-analyzer", "Unsupported Analyzer", 500, private=True)),
    (KeyGrantError, Refusal("configuration-error", "Configuration Error", 500, private=True)),
    (ConfigError, Refusal("configuration-error", "Configuration Error", 500, private=True)),
    (ServiceError, Refusal("upstream-service-error", "Upstream Service Error", 502, private=True)),
    (StrataError, Refusal("internal-error", "Internal Server Error", 500, private=True)),
)


# A retrieval the engine ran that failed (its meta record says why); a deadline that ran out is DeadlineExceeded's.
RETRIEVAL_FAILED = Refusal("retrieval-failed", "Retrieval Failed", 503, RETRY_S)


def refusal_of(error: type[BaseException]) -> Refusal:
    """The table's answer to an error class (its last row, ``StrataError``, answers any class the table forgot)."""
    return next(refusal for cls, refusal in ERROR_TABLE if issubclass(error, cls))


def refusal_for(exc: BaseException) -> Refusal:
    return refusal_of(type(exc))


class Problem(Exception):
    """An error answer: status, a short title, a detail for people and extra members."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        title: str | None = None,
        headers: dict[str, str] | None = None,
        slug: str | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.title = title or HTTPStatus(status).phrase
        self.detail = detail
        self.headers = headers or {}
        self.slug = slug
        self.extra = extra

    @classmethod
    def of(cls, refusal: Refusal, detail: str, **extra: Any) -> Problem:
        """The answer ``refusal`` gives, worded by the route (with extra members such as the meta record)."""
        headers = {"Retry-After": str(refusal.retry_after_s)} if refusal.retry_after_s else None
        return cls(refusal.status, detail, title=refusal.title, headers=headers, slug=refusal.slug, **extra)


def problem_response(
    status: int,
    detail: str,
    *,
    request_id: str | None,
    title: str | None = None,
    headers: dict[str, str] | None = None,
    slug: str | None = None,
    **extra: Any,
) -> JSONResponse:
    title = title or HTTPStatus(status).phrase
    body = {
        "type": TYPE_BASE + (slug or title.lower().replace(" ", "-")),
        "title": title,
        "status": status,
        "detail": detail,
        "request_id": request_id,
        **extra,
    }
    return JSONResponse(body, status_code=status, headers=headers, media_type=MEDIA_TYPE)


def logged_problem_response(status: int, detail: str, **answer: Any) -> JSONResponse:
    """``problem_response`` for an answer no exception handler gives (a middleware's: a refused key, a busy
    service, a body too large or too slow), logged once as the handlers log theirs."""
    title = answer.get("title") or HTTPStatus(status).phrase
    _log_answer(status, answer.get("slug") or title.lower().replace(" ", "-"), detail)
    return problem_response(status, detail, **answer)


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def install(app: FastAPI, *, request_id_header: str = "X-Request-ID", routes: Sequence[BaseRoute] = ()) -> None:
    """Registers the handlers that turn every error into a problem document.

    Starlette answers unexpected exceptions outside every middleware, so that handler sets the request id header
    itself (``RequestContext`` adds it to every other answer). ``routes`` are the app's routes (those of its
    routers): a 405 and OPTIONS list every method they answer at the request's path.
    """

    async def not_allowed_or_http(request: Request, exc: Exception) -> Response:
        return await _http(request, exc, routes)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        request_id = request_id_of(request)
        logger.error("unexpected error: %s", type(exc).__name__, exc_info=exc, extra={"request_id": request_id})
        return problem_response(
            500,
            "internal error; the request id is in the service log",
            request_id=request_id,
            headers={request_id_header: request_id} if request_id else None,
        )

    app.add_exception_handler(Problem, _problem)
    app.add_exception_handler(StrataError, _refused)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(StarletteHTTPException, not_allowed_or_http)
    app.add_exception_handler(Exception, unexpected)


def _log_answer(status: int, slug: str, detail: str, exc: BaseException | None = None) -> None:
    """One line per error answer: 4xx at INFO, 5xx at ERROR (a 500 with its traceback)."""
    level = logging.ERROR if status >= 500 else logging.INFO
    logger.log(level, "%d %s: %s", status, slug, detail, exc_info=exc if status == 500 else None)


async def _problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Problem)
    _log_answer(exc.status, exc.slug or exc.title.lower().replace(" ", "-"), exc.detail)
    return problem_response(
        exc.status,
        exc.detail,
        request_id=request_id_of(request),
        title=exc.title,
        headers=exc.headers,
        slug=exc.slug,
        **exc.extra,
    )


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    refusal = refusal_for(exc)
    request_id = request_id_of(request)
    _log_answer(refusal.status, refusal.slug, f"{type(exc).__name__}: {exc}", exc)
    return problem_response(
        refusal.status,
        refusal.detail_of(exc),
        request_id=request_id,
        title=refusal.title,
        headers=refusal.headers_of(exc),
        slug=refusal.slug,
    )


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in exc.errors()
    ]
    detail = "; ".join(f"{'.'.join(e['loc'])}: {e['msg']}" for e in errors[:5])
    _log_answer(INVALID_INPUT.status, INVALID_INPUT.slug, detail)  # names and rules, never the values sent
    return problem_response(
        INVALID_INPUT.status,
        detail,
        request_id=request_id_of(request),
        title=INVALID_INPUT.title,
        slug=INVALID_INPUT.slug,
        errors=errors,
    )


async def _http(request: Request, exc: Exception, routes: Sequence[BaseRoute]) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code == 405 and routes:  # Starlette's Allow names the methods of the path's first route only
        headers["Allow"] = allowed_methods(request, routes)
        if request.method == "OPTIONS":
            return Response(status_code=204, headers={"Allow": headers["Allow"]})
    _log_answer(exc.status_code, HTTPStatus(exc.status_code).phrase.lower().replace(" ", "-"), str(exc.detail))
    return problem_response(exc.status_code, str(exc.detail), request_id=request_id_of(request), headers=headers)


def allowed_methods(request: Request, routes: Sequence[BaseRoute]) -> str:
    """Every method some route of the request's path answers, and OPTIONS (answered here)."""
    methods = {"OPTIONS"}
    for route in routes:
        if route.matches(request.scope)[0] != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods, key=lambda m: ((*_METHOD_ORDER, m)).index(m)))
