"""The rerank client: one HTTP call that reorders candidate passages.

``HttpReranker`` speaks to a rerank service through a small adapter per wire
format (``jina``/``cohere``, ``tei``, ``dashscope``; see ``_rerank_adapters``).
It never falls back: every failure - unreachable, HTTP error, timeout, or an
answer that does not fit the request - raises ``RerankError`` with the reason,
and retrieval decides to keep the fused order.

Retries live here and only here: at most ``max_retries`` more attempts, and only
for failures that happen before the service started working on the request or
that the service marks as temporary (connect errors and connect timeouts, HTTP
429 and 5xx). A *read* timeout is not retried: a service that hangs for
``read_timeout_s`` will most likely hang again, and retrying would double the
latency the user waits for before retrieval falls back anyway.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from strata.config import ConfigError, RerankSettings
from strata.errors import InvalidArgumentError, RerankError
from strata.rag._rerank_adapters import ADAPTERS, RerankRequest, parse_results

logger = logging.getLogger(__name__)

_BODY_EXCERPT_CHARS = 200


@dataclass(frozen=True)
class RerankScore:
    """One reranked document: its position in the input and the service's score."""

    index: int
    score: float


@runtime_checkable
class Reranker(Protocol):
    """Scores documents against a query; raises ``RerankError`` when it cannot."""

    @property
    def provider(self) -> str: ...

    def rerank(
        self, query: str, documents: Sequence[str], *, top_n: int | None = None, timeout_s: float | None = None
    ) -> list[RerankScore]:
        """Scores of the best ``top_n`` documents (all when None), best first, within ``timeout_s``."""
        ...

    def close(self) -> None:
        """Releases the connection pool."""
        ...


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    # ReadTimeout is deliberately absent: see the module docstring.
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    logger.warning("rerank attempt %d failed (%s); retrying", state.attempt_number, _describe(exc))


def _describe(exc: BaseException | None) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return f"{type(exc).__name__}: {exc}"


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= _BODY_EXCERPT_CHARS else flat[:_BODY_EXCERPT_CHARS] + "..."


class HttpReranker:
    """A rerank service behind one ``httpx.Client``; one POST per ``rerank`` call.

    ``transport`` replaces the network for tests (``httpx.MockTransport`` or a
    wrapper around ``httpx.HTTPTransport``). Close it with ``close()`` or use it
    as a context manager.
    """

    def __init__(
        self,
        url: str,
        *,
        provider: str = "jina",
        model: str = "",
        api_key: str = "",
        top_n: int | None = None,
        connect_timeout_s: float = 2.0,
        read_timeout_s: float = 10.0,
        max_retries: int = 1,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not url:
            raise ConfigError("STRATA_RERANK__URL is empty: rerank is off, build no reranker")
        if provider not in ADAPTERS:
            raise ConfigError(
                f"STRATA_RERANK__PROVIDER: unknown rerank provider {provider!r}, expected one of {sorted(ADAPTERS)}"
            )
        self._url = url
        self._provider = provider
        self._adapter = ADAPTERS[provider]
        self._model = model
        self._top_n = top_n
        self._max_retries = max_retries
        # Sending the body shares the read budget; waiting for a pooled
        # connection shares the connect budget.
        self._timeout = httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=read_timeout_s, pool=connect_timeout_s
        )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(headers=headers, timeout=self._timeout, transport=transport)

    @classmethod
    def from_settings(cls, settings: RerankSettings, *, transport: httpx.BaseTransport | None = None) -> HttpReranker:
        """The reranker ``settings`` describe (``settings.url`` must be set)."""
        return cls(
            settings.url,
            provider=settings.provider,
            model=settings.model,
            api_key=settings.api_key.get_secret_value(),
            top_n=settings.top_n,
            connect_timeout_s=settings.connect_timeout_s,
            read_timeout_s=settings.read_timeout_s,
            max_retries=settings.max_retries,
            transport=transport,
        )

    @property
    def provider(self) -> str:
        return self._provider

    @property
    def model(self) -> str:
        return self._model

    def rerank(
        self, query: str, documents: Sequence[str], *, top_n: int | None = None, timeout_s: float | None = None
    ) -> list[RerankScore]:
        """Scores of the best ``top_n`` documents, best first; ``RerankError`` on any failure.

        ``top_n`` overrides the configured one; both default to every document. ``timeout_s``
        cuts the read timeout (what is left of a request's deadline) and disables retries.
        """
        if not documents:
            return []
        limit = self._limit(top_n, len(documents))
        request = RerankRequest(model=self._model, query=query, documents=list(documents), top_n=limit)
        payload = self._post(self._adapter.body(request), timeout_s)
        pairs = parse_results(self._adapter.results(payload), self._adapter, request)
        return [RerankScore(index, score) for index, score in pairs]

    def _limit(self, top_n: int | None, count: int) -> int:
        limit = top_n if top_n is not None else self._top_n
        if limit is not None and limit < 1:
            raise InvalidArgumentError(f"top_n must be at least 1, got {limit}")
        return count if limit is None else min(limit, count)

    def _post(self, body: dict[str, Any], timeout_s: float | None = None) -> Any:
        response = self._send(body, timeout_s)
        try:
            return response.json()
        except ValueError as exc:
            raise RerankError(f"rerank service at {self._url} answered non-JSON: {_excerpt(response.text)!r}") from exc

    def _send(self, body: dict[str, Any], timeout_s: float | None = None) -> httpx.Response:
        read, connect = self._timeout.read, self._timeout.connect
        cut = timeout_s is not None and read is not None and timeout_s < read
        timeout = self._timeout
        if cut and timeout_s is not None:
            timeout = httpx.Timeout(timeout_s, connect=timeout_s if connect is None else min(timeout_s, connect))
        retrying = Retrying(
            stop=stop_after_attempt(1 if cut else self._max_retries + 1),
            wait=wait_exponential(multiplier=0.1, max=1.0),
            retry=retry_if_exception(_is_transient),
            before_sleep=_log_retry,
            reraise=True,
        )
        try:
            return retrying(self._post_once, body, timeout)
        except httpx.TimeoutException as exc:
            raise RerankError(self._timed_out(exc, timeout)) from exc
        except httpx.HTTPStatusError as exc:
            status, text = exc.response.status_code, _excerpt(exc.response.text)
            raise RerankError(f"rerank service at {self._url} answered HTTP {status}: {text!r}") from exc
        except httpx.HTTPError as exc:
            raise RerankError(f"rerank request to {self._url} failed: {_describe(exc)}") from exc

    def _post_once(self, body: dict[str, Any], timeout: httpx.Timeout) -> httpx.Response:
        response = self._client.post(self._url, json=body, timeout=timeout)
        response.raise_for_status()
        return response

    def _timed_out(self, exc: httpx.TimeoutException, timeout: httpx.Timeout) -> str:
        phase, seconds = {
            httpx.ConnectTimeout: ("connect", timeout.connect),
            httpx.WriteTimeout: ("write", timeout.write),
            httpx.PoolTimeout: ("pool", timeout.pool),
        }.get(type(exc), ("read", timeout.read))
        return f"rerank timed out after {seconds}s ({phase}) at {self._url}"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpReranker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def build_reranker(settings: RerankSettings, *, transport: httpx.BaseTransport | None = None) -> HttpReranker | None:
    """The configured reranker, or None when ``settings.url`` is empty (rerank off)."""
    return HttpReranker.from_settings(settings, transport=transport) if settings.url else None
