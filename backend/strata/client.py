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

``AsyncStrataClient`` is the same client for an event loop (``httpx.AsyncClient``): the same methods,
arguments, answers and errors, awaited. Both send the library's request record (``strata.request``).

Answers are read by the records' own definition (``strata.wire``): fields a
newer service adds are ignored, fields an older one lacks take their defaults.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar, cast

import httpx

from strata.errors import InvalidArgumentError, NotFoundError, ServiceError
from strata.request import RetrievalRequest, request_body, takes_request_options
from strata.types import RetrievalMeta, RetrievalResult, StageError
from strata.upload_batches import added_up, halves, upload_batches
from strata.wire import from_json

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
ANSWER_MARGIN_S = 2.0  # a query's deadline plus this is long enough for its answer to arrive


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
        self._several_requests: bool | None = None  # the service takes an upload in several requests

    def __enter__(self) -> StrataClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- retrieval -----------------------------------------------------------------

    @takes_request_options
    def retrieve_documents(
        self, query: str, top_k: int = 5, *, timeout: float | None = None, **options: Any
    ) -> RetrievalResult:
        """The library's ``retrieve_documents`` over HTTP (see the module docstring for what it raises).

        ``options`` are the fields of ``strata.request.RetrievalRequest``, as the library's (this call's signature
        lists them). ``deadline_ms`` is the service's time budget for this query (never past its own
        ``STRATA_RETRIEVAL__DEADLINE_MS``); ``timeout`` bounds the whole call in seconds (default: ``deadline_ms``
        plus ``ANSWER_MARGIN_S`` when given, else the client's timeout).
        """
        request = RetrievalRequest(query, top_k, **options)
        response = self._send(
            "POST", "/retrieve", json=_retrieve_body(request), timeout=_call_timeout(request, timeout)
        )
        return _retrieval(response)

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
        ``force``, is refused: ``ServiceError`` 409 naming the count, and nothing deleted.

        Any number of files: sent in requests of at most ``UPLOAD_FILES`` files and ``UPLOAD_BYTES`` bytes
        (``strata.upload_batches``), the first with ``recreate``, the last with ``delete_missing`` and the names
        sent before, so that only documents whose files were not sent at all are deleted, after every file was
        indexed; the reports are added up. ``timeout`` bounds each request. A file the service finds too large
        for a request of its own (413) fails alone; the others are sent.
        """
        batches = deque(upload_batches(files))
        if delete_missing and len(batches) > 1:
            self._check_several_requests(len(files))
        reports: list[dict[str, Any]] = []
        refused: list[dict[str, str]] = []
        while batches:
            batch = batches.popleft()
            deleting = delete_missing and not batches
            sending = {name for name, _ in batch}
            present = [name for name, _ in files if name not in sending] if deleting else []
            if present:
                self._check_several_requests(len(files))
            flags = {"delete_missing": deleting, "recreate": recreate and not reports, "dry_run": dry_run}
            params = _upload_params({**flags, "force": force}, root=root, keep=keep, max_delete=max_delete)
            try:
                reports.append(self._upload(kb_id, batch, params=params, present=present, timeout=timeout))
            except ServiceError as exc:
                if exc.status != 413:
                    raise _after(exc, reports) from exc
                if len(batch) > 1:  # the service has a lower limit than this client assumes
                    batches.extendleft(reversed(halves(batch)))
                else:
                    refused.append({"source": batch[0][0], "reason": f"the service refused the file: {exc}"})
        report: dict[str, Any] = {"kb": kb_id, "dry_run": dry_run, "failed": 0, "failures": []}
        report = added_up(reports) if reports else report
        return {**report, "failed": report["failed"] + len(refused), "failures": [*refused, *report["failures"]]}

    def _upload(
        self,
        kb_id: str,
        files: Sequence[tuple[str, Path]],
        *,
        params: list[tuple[str, str]],
        present: Sequence[str],
        timeout: float | None,
    ) -> dict[str, Any]:
        """One request of ``index_files``; ``present`` names the files of the root sent in earlier ones."""
        handles = [(name, path.open("rb")) for name, path in files]
        try:
            parts: list[tuple[str, Any]] = [("files", (str(PurePosixPath(name)), handle)) for name, handle in handles]
            if present:
                parts.append(("present", ("present.json", json.dumps(list(present)).encode(), "application/json")))
            response = self._send(
                "POST", f"/kbs/{kb_id}/documents", files=parts, params=params, timeout=_timeout(timeout)
            )
        finally:
            for _, handle in handles:
                handle.close()
        return self._json(response)

    def _check_several_requests(self, files: int) -> None:
        """Refuses, before anything is sent, a service whose upload does not take the names sent before (its
        ``present`` part): one that did not would delete the documents of the files of the earlier requests."""
        if self._several_requests is None:
            schemas = self._json(self._send("GET", "/openapi.json")).get("components", {}).get("schemas", {})
            self._several_requests = any({"files", "present"} <= set(s.get("properties", {})) for s in schemas.values())
        if not self._several_requests:
            raise ServiceError(
                f"the service at {self._http.base_url} cannot take {files} files in several requests with "
                "delete_missing (it is older than this client): upgrade it, or index without delete_missing"
            )

    def delete_document(self, kb_id: str, doc_id: str) -> None:
        self._json(self._send("DELETE", f"/kbs/{kb_id}/documents/{doc_id}"))

    def list_kbs(self) -> list[dict[str, Any]]:
        return self._json(self._send("GET", "/kbs"))["kbs"]

    def ready(self) -> dict[str, Any]:
        """The component map; a 503 is returned as data (``status == "unavailable"``), not raised."""
        return _readiness(self._send("GET", "/ready"))

    # -- plumbing --------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self._http.base_url) from exc

    def _json(self, response: httpx.Response) -> Any:
        return _answer(response)


def _upload_params(
    flags: dict[str, bool], *, root: str, keep: Sequence[str], max_delete: int | None
) -> list[tuple[str, str]]:
    params = [(k, str(v).lower()) for k, v in flags.items()] + [("root", root), *(("keep", name) for name in keep)]
    return params + ([("max_delete", str(max_delete))] if max_delete is not None else [])


def _after(exc: ServiceError, reports: Sequence[dict[str, Any]]) -> ServiceError:
    """``exc``, saying what the earlier requests of the upload did (their files are indexed)."""
    if not reports:
        return exc
    sent = sum(r.get("added", 0) + r.get("updated", 0) + r.get("unchanged", 0) for r in reports)
    message = f"{exc} ({sent} files of the earlier requests of this upload were indexed; nothing was deleted)"
    return ServiceError(message, status=exc.status, problem=exc.problem)


def _answer(response: httpx.Response) -> Any:
    """The JSON of a successful answer; else the error both clients raise for it (the module docstring's)."""
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


def _unreachable(exc: httpx.HTTPError, base_url: httpx.URL) -> ServiceError:
    """The error both clients raise when no answer came."""
    if isinstance(exc, httpx.TimeoutException):
        return ServiceError(f"no answer from the strata service at {base_url} in time: {exc!r}")
    return ServiceError(f"cannot reach the strata service at {base_url}: {exc}")


def _readiness(response: httpx.Response) -> dict[str, Any]:
    readiness: dict[str, Any] = response.json() if response.status_code in (200, 503) else _answer(response)
    return readiness


def _retrieve_body(request: RetrievalRequest) -> dict[str, Any]:
    """``POST /retrieve``'s body: the request's JSON (``strata.request.request_body``), with the per-document trace."""
    return {**request_body(request), "explain": True}


def _call_timeout(request: RetrievalRequest, seconds: float | None) -> httpx.Timeout | Any:
    """A retrieval's timeout: ``seconds``, else its deadline plus ``ANSWER_MARGIN_S``, else the client's."""
    if seconds is None and request.deadline_ms is not None:
        seconds = request.deadline_ms / 1000 + ANSWER_MARGIN_S
    return _timeout(seconds)


def _retrieval(response: httpx.Response) -> RetrievalResult:
    """A retrieval's answer: the result, a failed one's meta record (the service ran it; it failed), or the error."""
    if response.status_code in (503, 504) and "meta" in _problem(response):
        return RetrievalResult(docs=(), meta=_meta(_problem(response)["meta"]))
    return RetrievalResult.from_dict(_answer(response))


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


Method = TypeVar("Method", bound=Callable[..., Any])


def _signature_of(source: Callable[..., Any]) -> Callable[[Method], Method]:
    """A method that publishes ``source``'s signature (``inspect.signature``, ``help``) as its own."""

    def publish(method: Method) -> Method:
        cast(Any, method).__signature__ = inspect.signature(source)
        return method

    return publish


class AsyncStrataClient:
    """``StrataClient`` for an event loop, on ``httpx.AsyncClient``: the same methods with the same arguments,
    answers and errors, awaited (``async with AsyncStrataClient(url, key) as client``). A call holds no thread
    while it waits for the service, so one loop carries many concurrent retrievals.

    ``index_files`` is the one exception: it runs ``StrataClient.index_files`` in a worker thread (an upload
    reads files and is sent in batches by that one loop; a thread per upload costs nothing next to it).
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)
        self._connection = (url, api_key, timeout)
        self._uploads: StrataClient | None = None

    async def __aenter__(self) -> AsyncStrataClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()
        if self._uploads is not None:
            self._uploads.close()

    @takes_request_options
    async def retrieve_documents(
        self, query: str, top_k: int = 5, *, timeout: float | None = None, **options: Any
    ) -> RetrievalResult:
        """``StrataClient.retrieve_documents``, awaited."""
        request = RetrievalRequest(query, top_k, **options)
        timeout_s = _call_timeout(request, timeout)
        return _retrieval(await self._send("POST", "/retrieve", json=_retrieve_body(request), timeout=timeout_s))

    @_signature_of(StrataClient.index_files)  # the blocking client's arguments, whatever they become
    async def index_files(self, kb_id: str, files: Sequence[tuple[str, Path]], **options: Any) -> dict[str, Any]:
        """``StrataClient.index_files`` (the same arguments), in a worker thread."""
        if self._uploads is None:
            url, api_key, timeout = self._connection
            self._uploads = StrataClient(url, api_key, timeout=timeout)
        return await asyncio.to_thread(self._uploads.index_files, kb_id, files, **options)

    async def delete_document(self, kb_id: str, doc_id: str) -> None:
        _answer(await self._send("DELETE", f"/kbs/{kb_id}/documents/{doc_id}"))

    async def list_kbs(self) -> list[dict[str, Any]]:
        kbs: list[dict[str, Any]] = _answer(await self._send("GET", "/kbs"))["kbs"]
        return kbs

    async def ready(self) -> dict[str, Any]:
        """``StrataClient.ready``, awaited."""
        return _readiness(await self._send("GET", "/ready"))

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self._http.base_url) from exc
