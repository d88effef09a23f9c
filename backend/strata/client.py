"""The HTTP client of strata's service, with the library's call.

Switching a caller from in-process to remote is one line::

    from strata.rag import retrieve_documents            # in-process
    retrieve_documents = StrataClient(url, api_key).retrieve_documents   # remote

``retrieve_documents`` takes the library's arguments (its ``settings`` aside:
the service's apply) plus ``timeout``, and returns the same
``RetrievalResult`` (with the per-document trace). A retrieval the service
ran but that failed comes back, as from the library, with
``meta.status == "failed"``. Unlike the library it raises when there is no
answer to return: ``InvalidArgumentError`` (a ``ValueError``) for bad
arguments, ``NotFoundError`` for an unknown (or unreadable) kb, and
``ServiceError`` when the service cannot be reached, does not answer within
``timeout``, refuses the key (401, 403), is busy (503 with Retry-After) or
answers any other error.

Answers are read by the records' own definition (``strata.wire``): fields a
newer service adds are ignored, fields an older one lacks take their defaults.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import httpx

from strata.errors import InvalidArgumentError, NotFoundError, StrataError
from strata.types import Filters, RetrievalMeta, RetrievalResult, StageError
from strata.wire import from_json

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
ANSWER_MARGIN_S = 2.0  # a query's deadline plus this is long enough for its answer to arrive


class ServiceError(StrataError):
    """The service refused a request or could not be reached; ``status`` is the HTTP status (0 = no answer)."""

    def __init__(self, message: str, *, status: int = 0, problem: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.problem = problem or {}


class StrataClient:
    """A strata service at ``url``; ``api_key`` is sent as a bearer token."""

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)

    def __enter__(self) -> StrataClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- retrieval -----------------------------------------------------------------

    def retrieve_documents(
        self,
        query: str,
        top_k: int = 5,
        *,
        kb_ids: list[str] | None = None,
        filters: Filters | None = None,
        rerank: bool = True,
        expand: bool = True,
        strategy: str | None = None,
        queries: Sequence[str] | None = None,
        deadline_ms: int | None = None,
        max_chars: int | None = None,
        timeout: float | None = None,
    ) -> RetrievalResult:
        """The library's ``retrieve_documents`` over HTTP (see the module docstring for what it raises).

        ``deadline_ms`` is the service's time budget for this query (never past its own
        ``STRATA_RETRIEVAL__DEADLINE_MS``); ``timeout`` bounds the whole call in seconds (default:
        ``deadline_ms`` plus ``ANSWER_MARGIN_S`` when given, else the client's timeout). ``max_chars`` caps the
        evidence's characters as the library's does (``strata.rag.budget``).
        """
        body: dict[str, Any] = {"query": query, "top_k": top_k, "kb_ids": kb_ids, "explain": True}
        if filters is not None and not filters.is_empty():
            body["filters"] = {k: v for k, v in filters.to_dict().items() if v}
        optional = {
            "strategy": strategy,
            "queries": list(queries) if queries is not None else None,
            "deadline_ms": deadline_ms,
            "max_chars": max_chars,
        }
        body.update({"rerank": rerank, "expand": expand, **{k: v for k, v in optional.items() if v is not None}})
        if timeout is None and deadline_ms is not None:
            timeout = deadline_ms / 1000 + ANSWER_MARGIN_S
        response = self._send("POST", "/retrieve", json=body, timeout=_timeout(timeout))
        if response.status_code in (503, 504) and "meta" in _problem(response):  # the service ran it; it failed
            return RetrievalResult(docs=(), meta=_meta(_problem(response)["meta"]))
        return RetrievalResult.from_dict(self._json(response))

    # -- knowledge bases -------------------------------------------------------------

    def index_files(
        self,
        kb_id: str,
        files: Sequence[tuple[str, Path]],
        *,
        delete_missing: bool = False,
        recreate: bool = False,
        dry_run: bool = False,
        timeout: float | None = None,
        root: str = "",
        keep: Sequence[str] = (),
        max_delete: int | None = None,
        force: bool = False,
    ) -> dict[str, Any]:
        """Uploads ``(relative name, path)`` pairs into ``kb_id``; the indexing report (``strata index --json``).

        ``root`` names the folder the files came from (``delete_missing`` deletes only that root's documents);
        ``keep`` are files of it that could not be read here (their documents are kept). ``delete_missing``
        deleting over ``max_delete`` (default: the service's setting) or half the root's documents, unless
        ``force``, is refused: ``ServiceError`` 409 naming the count, and nothing written.
        """
        flags = {"delete_missing": delete_missing, "recreate": recreate, "dry_run": dry_run, "force": force}
        params: list[tuple[str, str]] = [(k, str(v).lower()) for k, v in flags.items()]
        params += [("root", root), *(("keep", name) for name in keep)]
        params += [("max_delete", str(max_delete))] if max_delete is not None else []
        handles = [(name, path.open("rb")) for name, path in files]
        try:
            parts = [("files", (str(PurePosixPath(name)), handle)) for name, handle in handles]
            response = self._send(
                "POST", f"/kbs/{kb_id}/documents", files=parts, params=params, timeout=_timeout(timeout)
            )
        finally:
            for _, handle in handles:
                handle.close()
        return self._json(response)

    def delete_document(self, kb_id: str, doc_id: str) -> None:
        self._json(self._send("DELETE", f"/kbs/{kb_id}/documents/{doc_id}"))

    def list_kbs(self) -> list[dict[str, Any]]:
        return self._json(self._send("GET", "/kbs"))["kbs"]

    def ready(self) -> dict[str, Any]:
        """The component map; a 503 is returned as data (``status == "unavailable"``), not raised."""
        response = self._send("GET", "/ready")
        return response.json() if response.status_code in (200, 503) else self._json(response)

    # -- plumbing --------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException as exc:
            raise ServiceError(f"no answer from the strata service at {self._http.base_url} in time: {exc!r}") from exc
        except httpx.HTTPError as exc:
            raise ServiceError(f"cannot reach the strata service at {self._http.base_url}: {exc}") from exc

    def _json(self, response: httpx.Response) -> Any:
        if response.is_success:
            return response.json()
        problem = _problem(response)
        detail = problem.get("detail") or response.text[:300]
        message = f"{response.status_code} {problem.get('title', response.reason_phrase)}: {detail}"
        if response.status_code == 422:
            raise InvalidArgumentError(message)
        if response.status_code == 404:
            raise NotFoundError(message)
        raise ServiceError(message, status=response.status_code, problem=problem)


def _timeout(seconds: float | None) -> httpx.Timeout | Any:
    """One call's timeout in seconds, or the client's."""
    return httpx.Timeout(seconds, connect=min(seconds, 5.0)) if seconds else httpx.USE_CLIENT_DEFAULT


def _problem(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _meta(data: Any) -> RetrievalMeta:
    """The meta record of a failed retrieval's answer. Fields this client does not know are ignored and those
    it misses take their defaults (``RetrievalMeta.from_dict``); a record it cannot read at all still says
    that the retrieval failed, with the errors it can read."""
    try:
        return RetrievalMeta.from_dict(data)
    except ValueError:  # pydantic's ValidationError: a service of another version; keep what is known
        known = data if isinstance(data, dict) else {}
        try:
            errors = from_json(tuple[StageError, ...], known.get("errors", ()))
        except ValueError:
            errors = ()
        return RetrievalMeta(
            query=str(known.get("query", "")), top_k=0, candidate_k=0, status="failed", mode="failed", errors=errors
        )
