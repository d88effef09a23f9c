"""Wire formats of rerank services, and the checks every answer must pass.

An adapter builds the request body and finds the list of results in the
answer; ``parse_results`` then checks that list the same way for every
provider, so a service that answers nonsense fails loudly instead of
reordering passages at random.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from strata.errors import RerankError


@dataclass(frozen=True)
class RerankRequest:
    """What one rerank call asks for; ``top_n`` is already capped to the documents."""

    model: str
    query: str
    documents: list[str]
    top_n: int


class RerankAdapter(Protocol):
    """One service's request body and answer layout."""

    score_key: str
    honours_top_n: bool

    def body(self, request: RerankRequest) -> dict[str, Any]: ...

    def results(self, payload: Any) -> Any: ...


def _field(payload: Any, key: str, where: str) -> Any:
    if not isinstance(payload, dict) or key not in payload:
        raise RerankError(f"rerank answer has the wrong shape: expected {where} to be an object with {key!r}")
    return payload[key]


def _with_model(model: str, body: dict[str, Any]) -> dict[str, Any]:
    # An empty model is left out so that single-model servers (vLLM,
    # Xinference) pick the one they serve instead of rejecting "".
    return {"model": model, **body} if model else body


class JinaAdapter:
    """Jina and Cohere ``/v1/rerank``; also what vLLM and Xinference serve."""

    score_key = "relevance_score"
    honours_top_n = True

    def body(self, request: RerankRequest) -> dict[str, Any]:
        return _with_model(
            request.model,
            {
                "query": request.query,
                "documents": request.documents,
                "top_n": request.top_n,
                "return_documents": False,
            },
        )

    def results(self, payload: Any) -> Any:
        return _field(payload, "results", "the answer")


class TeiAdapter:
    """Hugging Face text-embeddings-inference ``/rerank``: always scores every text."""

    score_key = "score"
    honours_top_n = False

    def body(self, request: RerankRequest) -> dict[str, Any]:
        return {"query": request.query, "texts": request.documents, "truncate": True, "raw_scores": False}

    def results(self, payload: Any) -> Any:
        return payload


class DashScopeAdapter:
    """Alibaba DashScope ``text-rerank``."""

    score_key = "relevance_score"
    honours_top_n = True

    def body(self, request: RerankRequest) -> dict[str, Any]:
        return _with_model(
            request.model,
            {
                "input": {"query": request.query, "documents": request.documents},
                "parameters": {"top_n": request.top_n, "return_documents": False},
            },
        )

    def results(self, payload: Any) -> Any:
        return _field(_field(payload, "output", "the answer"), "results", "'output'")


ADAPTERS: dict[str, RerankAdapter] = {
    "jina": JinaAdapter(),
    "cohere": JinaAdapter(),
    "tei": TeiAdapter(),
    "dashscope": DashScopeAdapter(),
}


def parse_results(items: Any, adapter: RerankAdapter, request: RerankRequest) -> list[tuple[int, float]]:
    """``(index, score)`` of the best ``request.top_n`` documents, best first.

    Raises ``RerankError`` naming the first thing wrong with ``items``.
    """
    if not isinstance(items, list):
        raise RerankError(f"rerank answer has the wrong shape: results are {type(items).__name__}, not a list")
    count = len(request.documents)
    expected = request.top_n if adapter.honours_top_n else count
    if len(items) > count:
        raise RerankError(f"rerank answer has wrong length: {len(items)} results for {count} documents")
    if len(items) < expected:
        raise RerankError(f"rerank answer has wrong length: {len(items)} results, expected {expected}")
    pairs = [_pair(item, position, adapter.score_key, count) for position, item in enumerate(items)]
    _reject_duplicates(pairs)
    pairs.sort(key=lambda pair: (-pair[1], pair[0]))
    return pairs[: request.top_n]


def _pair(item: Any, position: int, score_key: str, count: int) -> tuple[int, float]:
    index = _field(item, "index", f"result {position}")
    score = _field(item, score_key, f"result {position}")
    if isinstance(index, bool) or not isinstance(index, int):
        raise RerankError(f"rerank answer has a bad index: result {position} has index {index!r}, not an int")
    if not 0 <= index < count:
        raise RerankError(f"rerank answer has a bad index: {index} is out of range for {count} documents")
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
        raise RerankError(f"rerank answer has a bad score: document {index} scored {score!r}, not a finite number")
    return index, float(score)


def _reject_duplicates(pairs: list[tuple[int, float]]) -> None:
    seen: set[int] = set()
    for index, _ in pairs:
        if index in seen:
            raise RerankError(f"rerank answer has a duplicate index: document {index} appears twice")
        seen.add(index)
