"""The rerank client against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from strata.config import ConfigError, RerankSettings
from strata.errors import RerankError
from strata.rag.rerank import HttpReranker, Reranker, RerankScore, build_reranker
from tests.rag.rerank_server import (
    RerankServer,
    answer,
    hang,
    in_turn,
    json_reply,
    raw,
    results,
    status,
)

QUERY = "milvus hybrid search"
DOCUMENTS = [
    "redis caches parent chunks",
    "milvus runs hybrid search over dense and sparse vectors",
    "bm25 search is the sparse half",
]

MakeReranker = Callable[..., HttpReranker]


@pytest.fixture
def make_reranker(rerank_server: RerankServer) -> Iterator[MakeReranker]:
    """Build rerankers from ``RerankSettings`` fields (url defaults to the server); closed afterwards."""
    built: list[HttpReranker] = []

    def make(transport: httpx.BaseTransport | None = None, **fields: Any) -> HttpReranker:
        settings = RerankSettings(**{"url": rerank_server.url, **fields})
        built.append(HttpReranker.from_settings(settings, transport=transport))
        return built[-1]

    yield make
    for reranker in built:
        reranker.close()


class CountingTransport(httpx.BaseTransport):
    """The real network transport, counting the requests it attempts."""

    def __init__(self) -> None:
        self.calls = 0
        self._inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def indices(scores: list[RerankScore]) -> list[int]:
    return [score.index for score in scores]


# --- answering correctly -----------------------------------------------------


@pytest.mark.parametrize("provider", ["jina", "cohere"])
def test_jina_format_body_headers_and_best_first_order(
    rerank_server: RerankServer, make_reranker: MakeReranker, provider: str
) -> None:
    rerank_server.behaviour = answer(provider)
    reranker = make_reranker(provider=provider, model="jina-reranker-v2-base-multilingual", api_key="sk-test")

    scores = reranker.rerank(QUERY, DOCUMENTS, top_n=2)

    assert scores == [RerankScore(1, 1.0), RerankScore(2, pytest.approx(1 / 3))]
    [request] = rerank_server.requests
    assert request.path == "/v1/rerank"
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.json() == {
        "model": "jina-reranker-v2-base-multilingual",
        "query": QUERY,
        "documents": DOCUMENTS,
        "top_n": 2,
        "return_documents": False,
    }


def test_tei_format_is_trimmed_to_top_n_client_side(rerank_server: RerankServer, make_reranker: MakeReranker) -> None:
    rerank_server.behaviour = answer("tei")
    reranker = make_reranker(provider="tei")

    scores = reranker.rerank(QUERY, DOCUMENTS, top_n=2)

    assert indices(scores) == [1, 2]
    [request] = rerank_server.requests
    assert "authorization" not in request.headers
    assert request.json() == {"query": QUERY, "texts": DOCUMENTS, "truncate": True, "raw_scores": False}


def test_dashscope_format(rerank_server: RerankServer, make_reranker: MakeReranker) -> None:
    rerank_server.behaviour = answer("dashscope")
    reranker = make_reranker(provider="dashscope", model="gte-rerank-v2", api_key="sk-ds")

    scores = reranker.rerank(QUERY, DOCUMENTS)

    assert indices(scores) == [1, 2, 0]
    [request] = rerank_server.requests
    assert request.headers["authorization"] == "Bearer sk-ds"
    assert request.json() == {
        "model": "gte-rerank-v2",
        "input": {"query": QUERY, "documents": DOCUMENTS},
        "parameters": {"top_n": 3, "return_documents": False},
    }


def test_results_are_sorted_best_first_whatever_order_the_service_uses(
    rerank_server: RerankServer, make_reranker: MakeReranker
) -> None:
    rerank_server.behaviour = results([(0, 0.1), (2, 0.9), (1, 0.5)])

    scores = make_reranker().rerank(QUERY, DOCUMENTS)

    assert scores == [RerankScore(2, 0.9), RerankScore(1, 0.5), RerankScore(0, 0.1)]
    assert all(isinstance(score.score, float) for score in scores)


def test_top_n_defaults_to_settings_then_all_and_is_capped_at_the_documents(
    rerank_server: RerankServer, make_reranker: MakeReranker
) -> None:
    configured = make_reranker(top_n=1)
    unconfigured = make_reranker()

    assert indices(configured.rerank(QUERY, DOCUMENTS)) == [1]
    assert indices(configured.rerank(QUERY, DOCUMENTS, top_n=2)) == [1, 2]
    assert len(unconfigured.rerank(QUERY, DOCUMENTS)) == 3
    assert len(unconfigured.rerank(QUERY, DOCUMENTS, top_n=50)) == 3
    assert [r.json()["top_n"] for r in rerank_server.requests] == [1, 2, 3, 3]


def test_model_is_left_out_when_not_configured(rerank_server: RerankServer, make_reranker: MakeReranker) -> None:
    make_reranker().rerank(QUERY, DOCUMENTS)

    assert "model" not in rerank_server.requests[0].json()


def test_empty_documents_return_nothing_without_a_call(
    rerank_server: RerankServer, make_reranker: MakeReranker
) -> None:
    assert make_reranker().rerank(QUERY, []) == []
    assert rerank_server.requests == []


def test_http_reranker_is_a_reranker(make_reranker: MakeReranker) -> None:
    reranker = make_reranker(provider="tei")

    assert isinstance(reranker, Reranker)
    assert reranker.provider == "tei"


def test_build_reranker_is_none_when_rerank_is_off() -> None:
    assert build_reranker(RerankSettings()) is None
    with pytest.raises(ConfigError, match="STRATA_RERANK__URL"):
        HttpReranker.from_settings(RerankSettings())


# --- retries -----------------------------------------------------------------


@pytest.mark.parametrize("code", [500, 503, 429])
def test_transient_failure_then_success_is_retried(
    rerank_server: RerankServer, make_reranker: MakeReranker, code: int
) -> None:
    rerank_server.behaviour = in_turn(status(code), answer())

    scores = make_reranker().rerank(QUERY, DOCUMENTS)

    assert indices(scores) == [1, 2, 0]
    assert len(rerank_server.requests) == 2


@pytest.mark.parametrize("max_retries", [0, 1, 2])
def test_persistent_500_fails_after_one_plus_max_retries(
    rerank_server: RerankServer, make_reranker: MakeReranker, max_retries: int
) -> None:
    rerank_server.behaviour = status(500, "CUDA out of memory")

    with pytest.raises(RerankError, match=r"HTTP 500: 'CUDA out of memory'"):
        make_reranker(max_retries=max_retries).rerank(QUERY, DOCUMENTS)

    assert len(rerank_server.requests) == 1 + max_retries


def test_persistent_429_fails_after_one_retry(rerank_server: RerankServer, make_reranker: MakeReranker) -> None:
    rerank_server.behaviour = status(429, "rate limited")

    with pytest.raises(RerankError, match="HTTP 429"):
        make_reranker().rerank(QUERY, DOCUMENTS)

    assert len(rerank_server.requests) == 2


@pytest.mark.parametrize("code", [400, 401, 404, 422])
def test_client_errors_are_not_retried(rerank_server: RerankServer, make_reranker: MakeReranker, code: int) -> None:
    rerank_server.behaviour = status(code, "bad request")

    with pytest.raises(RerankError, match=f"HTTP {code}"):
        make_reranker().rerank(QUERY, DOCUMENTS)

    assert len(rerank_server.requests) == 1


def test_long_error_bodies_are_cut_to_an_excerpt(rerank_server: RerankServer, make_reranker: MakeReranker) -> None:
    rerank_server.behaviour = status(400, "x" * 5000)

    with pytest.raises(RerankError) as caught:
        make_reranker().rerank(QUERY, DOCUMENTS)

    assert len(str(caught.value)) < 400


def test_read_timeout_fails_fast_and_is_not_retried(rerank_server: RerankServer, make_reranker: MakeReranker) -> None:
    rerank_server.behaviour = hang(5)
    reranker = make_reranker(read_timeout_s=0.3, max_retries=1)

    with pytest.raises(RerankError, match=r"rerank timed out after 0\.3s \(read\)"):
        reranker.rerank(QUERY, DOCUMENTS)

    assert len(rerank_server.requests) == 1  # the read timeout fired once and was not retried


def test_connection_refused_is_retried_once(refused_url: str, make_reranker: MakeReranker) -> None:
    transport = CountingTransport()
    reranker = make_reranker(transport=transport, url=refused_url)

    with pytest.raises(RerankError, match="ConnectError"):
        reranker.rerank(QUERY, DOCUMENTS)

    assert transport.calls == 2


# --- answers that must be refused ---------------------------------------------

NAN = math.nan


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [
        (raw("{not json"), "non-JSON"),
        (raw("<html>502 Bad Gateway</html>", content_type="text/html"), "non-JSON"),
        (lambda request: json_reply({"data": []}), "wrong shape"),
        (lambda request: json_reply({"results": {"0": 0.5}}), "wrong shape"),
        (lambda request: json_reply({"results": [{"index": 0}, {"index": 1}, {"index": 2}]}), "wrong shape"),
        (results([(1, 0.9)]), "wrong length"),
        (results([(0, 0.1), (1, 0.2), (2, 0.3), (0, 0.4)]), "wrong length"),
        (results([(0, 0.1), (1, 0.2), (7, 0.3)]), "bad index"),
        (results([(0, 0.1), (1, 0.2), (-1, 0.3)]), "bad index"),
        (results([(0, 0.1), (1, 0.2), ("2", 0.3)]), "bad index"),
        (results([(0, 0.1), (1, 0.2), (2.0, 0.3)]), "bad index"),
        (results([(0, 0.1), (1, 0.2), (True, 0.3)]), "bad index"),
        (results([(0, 0.1), (1, NAN), (2, 0.3)]), "bad score"),
        (results([(0, 0.1), (1, math.inf), (2, 0.3)]), "bad score"),
        (results([(0, 0.1), (1, None), (2, 0.3)]), "bad score"),
        (results([(0, 0.1), (1, "0.9"), (2, 0.3)]), "bad score"),
        (results([(0, 0.1), (1, 0.2), (1, 0.3)]), "duplicate index"),
    ],
    ids=[
        "malformed-json",
        "html",
        "no-results",
        "results-not-list",
        "no-score",
        "too-few",
        "more-than-documents",
        "index-out-of-range",
        "negative-index",
        "index-string",
        "index-float",
        "index-bool",
        "nan-score",
        "inf-score",
        "null-score",
        "string-score",
        "duplicate-index",
    ],
)
def test_unusable_answers_raise_without_retry(
    rerank_server: RerankServer, make_reranker: MakeReranker, behaviour: Any, reason: str
) -> None:
    rerank_server.behaviour = behaviour

    with pytest.raises(RerankError, match=reason):
        make_reranker().rerank(QUERY, DOCUMENTS)

    assert len(rerank_server.requests) == 1


def test_tei_answer_must_cover_every_text(rerank_server: RerankServer, make_reranker: MakeReranker) -> None:
    rerank_server.behaviour = results([(1, 0.9), (2, 0.4)], provider="tei")

    with pytest.raises(RerankError, match="wrong length: 2 results, expected 3"):
        make_reranker(provider="tei").rerank(QUERY, DOCUMENTS, top_n=2)


def test_dashscope_answer_without_output_is_the_wrong_shape(
    rerank_server: RerankServer, make_reranker: MakeReranker
) -> None:
    rerank_server.behaviour = lambda request: json_reply({"code": "InvalidParameter", "message": "bad"})

    with pytest.raises(RerankError, match=r"wrong shape.*'output'"):
        make_reranker(provider="dashscope").rerank(QUERY, DOCUMENTS)
