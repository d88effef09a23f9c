"""Async callers: the LangChain and LlamaIndex retrievers awaited on a strata service through ``AsyncStrataClient``
(no thread per call), and ``aretrieve_documents`` in-process (the engine in strata's pool, the loop free)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn

import strata.rag.retrieve as rag_retrieve
from strata.api import create_app
from strata.client import AsyncStrataClient, StrataClient
from strata.config import Settings
from strata.integrations.langchain import StrataRetriever as LangChainRetriever
from strata.integrations.llamaindex import StrataRetriever as LlamaIndexRetriever
from strata.rag.async_retrieve import aretrieve_documents
from strata.request import RetrievalRequest
from strata.resources import Resources
from strata.types import RetrievalMeta, RetrievalResult, RetrievedDocument
from tests.support.documents import RESET_QUERY
from tests.support.processes import free_port

pytestmark = pytest.mark.integration

CALLS = 20
POOL_THREADS = ("asyncio", "strata-query")  # the names of threads a call run in an executor would start


@pytest.fixture(scope="module")
def served(indexed: Settings, memo_encoder: Any) -> Iterator[str]:
    """The service's app on the indexed stores, served by uvicorn on loopback (no API keys)."""
    resources = Resources(indexed, encoder=memo_encoder)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(indexed, resources=resources), host="127.0.0.1", port=port, log_config=None)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)
    resources.close()


class Watching(httpx.AsyncBaseTransport):
    """A transport that records the thread of each request and how many were in flight at once, then sends it on
    (to ``inner``), or, with ``gate``, holds every request until ``gate`` of them are in flight: calls made one
    after another would wait forever."""

    def __init__(self, inner: httpx.AsyncBaseTransport | None = None, *, gate: int = 0) -> None:
        self.inner, self.gate = inner, gate
        self.threads: set[int] = set()
        self.in_flight = self.most_in_flight = 0
        self._all_in = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.threads.add(threading.get_ident())
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.inner is not None:
                return await self.inner.handle_async_request(request)
            if self.in_flight == self.gate:
                self._all_in.set()
            await asyncio.wait_for(self._all_in.wait(), timeout=60)  # a bound for a failure, never reached when passing
            answer = RetrievalResult(
                (RetrievedDocument("evidence", 0.5, {"chunk_id": "c1"}),), RetrievalMeta("q", 3, 9)
            )
            return httpx.Response(200, json=answer.to_dict())
        finally:
            self.in_flight -= 1


def pool_threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(POOL_THREADS)}


def test_twenty_concurrent_ainvoke_calls_are_in_flight_at_once_on_one_thread() -> None:
    gate = Watching(gate=CALLS)

    async def ask() -> list[Any]:
        async with AsyncStrataClient("http://strata.test", transport=gate) as client:
            retriever = LangChainRetriever(kb_ids=["demo"], top_k=3, async_client=client)
            return await asyncio.gather(*(retriever.ainvoke(f"question {n}") for n in range(CALLS)))

    before = pool_threads()
    answers = asyncio.run(ask())
    assert [len(docs) for docs in answers] == [1] * CALLS and answers[0][0].page_content == "evidence"
    assert gate.most_in_flight == CALLS and len(gate.threads) == 1  # all at once, all from the loop's thread
    assert pool_threads() == before  # no executor thread started for them


def test_the_langchain_retriever_answers_the_same_on_a_service_awaited_or_not(served: str) -> None:
    with StrataClient(served) as blocking:
        expected = LangChainRetriever(kb_ids=["demo"], top_k=3, client=blocking).invoke(RESET_QUERY)
    watching = Watching(httpx.AsyncHTTPTransport())

    async def ask() -> list[Any]:
        async with AsyncStrataClient(served, transport=watching) as client:
            retriever = LangChainRetriever(kb_ids=["demo"], top_k=3, async_client=client)
            return await asyncio.gather(*(retriever.ainvoke(RESET_QUERY) for _ in range(CALLS)))

    before = pool_threads()
    answers = asyncio.run(ask())
    assert expected and all([d.id for d in docs] == [d.id for d in expected] for docs in answers)
    assert answers[0][0].page_content == expected[0].page_content
    assert len(watching.threads) == 1 and pool_threads() == before


def test_the_llamaindex_retriever_answers_the_same_on_a_service_awaited_or_not(served: str) -> None:
    with StrataClient(served) as blocking:
        expected = LlamaIndexRetriever(kb_ids=["demo"], top_k=3, client=blocking).retrieve(RESET_QUERY)

    async def ask() -> list[Any]:
        async with AsyncStrataClient(served) as client:
            return await LlamaIndexRetriever(kb_ids=["demo"], top_k=3, async_client=client).aretrieve(RESET_QUERY)

    nodes = asyncio.run(ask())
    assert expected and [n.node.node_id for n in nodes] == [n.node.node_id for n in expected]


def test_a_retriever_with_an_async_client_only_refuses_a_blocking_call() -> None:
    retriever = LangChainRetriever(async_client=AsyncStrataClient("http://strata.test"))
    with pytest.raises(ValueError, match="async_client only"):
        retriever.invoke("q")


class Blocking:
    """An engine stand-in whose retrieve blocks until the event loop answers: it returns only if the loop is free
    while the call runs."""

    def __init__(self) -> None:
        self.loop_ran = threading.Event()
        self.threads: set[str] = set()

    def retrieve(self, query: str, top_k: int = 5, **options: Any) -> RetrievalResult:
        self.threads.add(threading.current_thread().name)
        assert self.loop_ran.wait(timeout=60), "the event loop was blocked"
        return RetrievalResult((), RetrievalMeta(RetrievalRequest(query, top_k, **options).query, top_k, 9))


def test_aretrieve_documents_runs_the_engine_in_stratas_pool_and_keeps_the_loop_free(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = Blocking()
    monkeypatch.setattr(rag_retrieve, "default_engine", lambda settings=None: engine)

    async def ask() -> RetrievalResult:
        pending = asyncio.ensure_future(aretrieve_documents("q", 3, kb_ids=["demo"]))
        await asyncio.sleep(0)  # let the call start; the loop then runs this coroutine on while the engine waits
        engine.loop_ran.set()
        return await pending

    assert asyncio.run(ask()).meta.query == "q"
    assert len(engine.threads) == 1 and next(iter(engine.threads)).startswith("strata-query")
