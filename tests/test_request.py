"""A request has one definition (``strata.request.RetrievalRequest``): the library's calls, the service's request
bodies, both clients and the query-cache key all derive from it, and each test here fails for a field one of
them lacks. Adding a request option is the record's field and one line in ``full_request``."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from typing import Any

import httpx
import pytest

import strata.rag.retrieve as rag_retrieve
from strata.api.schemas import ModuleRequest, RetrieveRequest, SkillRequest
from strata.client import AsyncStrataClient, StrataClient
from strata.rag.async_retrieve import aretrieve_documents
from strata.rag.retrieve import Retriever, query_cache_key, retrieve_documents
from strata.rag.run_state import RunInputs
from strata.request import CACHE_KEY_LEAVES_OUT, RetrievalRequest, option_names
from strata.types import Filters, RetrievalMeta, RetrievalResult, ServingState

pytestmark = pytest.mark.unit


def full_request() -> RetrievalRequest:
    """A request with every field set away from its default (a new field must be added here)."""
    return RetrievalRequest(
        "how long is a reset link valid",
        3,
        kb_ids=("demo",),
        filters=Filters(modules=("auth",)),
        rerank=False,
        expand=False,
        strategy="fusion",
        queries=("reset link lifetime",),
        deadline_ms=1234,
        max_chars=500,
    )


def options_of(request: RetrievalRequest) -> dict[str, Any]:
    """The keyword options of ``request`` (every field but the query and top_k)."""
    return {name: getattr(request, name) for name in option_names()[2:]}


def test_the_full_request_sets_every_field() -> None:
    """So that every test below covers a field added to the record (its one test edit)."""
    defaults = RetrievalRequest("q")
    full = full_request()
    assert [name for name in option_names() if getattr(full, name) == getattr(defaults, name)] == []


def test_the_wire_form_reads_back_and_holds_tuples() -> None:
    full = full_request()
    assert RetrievalRequest.from_dict(json.loads(json.dumps(full.to_dict()))) == full
    lists = RetrievalRequest("q", kb_ids=["demo"], queries=["v"], filters=Filters())
    assert (lists.kb_ids, lists.queries, lists.filters) == (("demo",), ("v",), None)


# -- the library's calls ----------------------------------------------------------------------------------------------

LIBRARY_CALLS = {
    "retrieve_documents": (retrieve_documents, {"settings"}),
    "aretrieve_documents": (aretrieve_documents, {"settings"}),
    "Retriever.retrieve": (Retriever.retrieve, {"self", "cache_scope"}),
    "StrataClient.retrieve_documents": (StrataClient.retrieve_documents, {"self", "timeout"}),
    "AsyncStrataClient.retrieve_documents": (AsyncStrataClient.retrieve_documents, {"self", "timeout"}),
}


@pytest.mark.parametrize("name", LIBRARY_CALLS)
def test_every_call_takes_every_field_with_its_default(name: str) -> None:
    call, own = LIBRARY_CALLS[name]
    record = inspect.signature(RetrievalRequest).parameters.values()
    taken = [p for p in inspect.signature(call).parameters.values() if p.name not in own]
    assert [(p.name, p.kind, p.default) for p in taken] == [(p.name, p.kind, p.default) for p in record]


class Recording:
    """A ``Retriever`` stand-in: records the request it is handed."""

    def __init__(self) -> None:
        self.requests: list[RetrievalRequest] = []
        self.result = RetrievalResult((), RetrievalMeta("q", 3, 9))

    def retrieve(self, query: str, top_k: int = 5, **options: Any) -> RetrievalResult:
        return Retriever.retrieve(self, query, top_k, **options)  # type: ignore[arg-type]

    def retrieve_request(self, request: RetrievalRequest, *, cache_scope: str | None = None) -> RetrievalResult:
        self.requests.append(request)
        return self.result


def test_the_library_calls_hand_the_engine_every_field(monkeypatch: pytest.MonkeyPatch) -> None:
    engine, full = Recording(), full_request()
    monkeypatch.setattr(rag_retrieve, "default_engine", lambda settings=None: engine)
    retrieve_documents(full.query, full.top_k, **options_of(full))
    asyncio.run(aretrieve_documents(full.query, full.top_k, **options_of(full)))
    assert engine.requests == [full, full]
    with pytest.raises(TypeError, match="no_such_option"):
        retrieve_documents("q", no_such_option=1)


# -- the clients --------------------------------------------------------------------------------------------------------


def answering_into(sent: list[dict[str, Any]]) -> httpx.MockTransport:
    """A service that records each body and answers an empty result."""

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(200, json=RetrievalResult((), RetrievalMeta("q", 3, 9)).to_dict())

    return httpx.MockTransport(answer)


def test_both_clients_send_every_field() -> None:
    full, sent = full_request(), []
    with StrataClient("http://strata.test", transport=answering_into(sent)) as client:
        client.retrieve_documents(full.query, full.top_k, **options_of(full))

    async def awaited() -> None:
        async with AsyncStrataClient("http://strata.test", transport=answering_into(sent)) as client:
            await client.retrieve_documents(full.query, full.top_k, **options_of(full))

    asyncio.run(awaited())
    assert len(sent) == 2 and sent[0] == sent[1]
    assert sent[0].pop("explain") is True and RetrievalRequest.from_dict(sent[0]) == full
    assert RetrieveRequest.model_validate({**sent[1]}).to_request() == full  # the service reads what was sent


# -- the service's request bodies -------------------------------------------------------------------------------------


@pytest.mark.parametrize("body", [RetrieveRequest, SkillRequest, ModuleRequest], ids=lambda b: b.__name__)
def test_every_request_body_holds_every_field(body: type[RetrieveRequest]) -> None:
    published = body.model_json_schema()["properties"]
    assert set(option_names()) <= set(published)
    full = full_request()
    if body is ModuleRequest:  # the route sets the modules filter itself: its schema takes it empty only
        full = dataclasses.replace(full, filters=Filters(doc_ids=("billing.md",)))
    own = {"skill": "浇水"} if body is SkillRequest else {"module": "billing"} if body is ModuleRequest else {}
    parsed = body.model_validate({**full.to_dict(), **own})
    assert parsed.to_request() == full


# -- the query cache's key ----------------------------------------------------------------------------------------------


def key_of(request: RetrievalRequest) -> str:
    inputs = RunInputs(request.query, request.top_k, 9, strategy="auto_merge")  # what the engine decided: held equal
    return query_cache_key(request, inputs, ServingState({"demo": ("e", 1)}, ()), scope="key-a", config={"x": 1})


def test_every_field_is_in_the_cache_key_unless_left_out_by_name() -> None:
    """A request that differs from another in one field gets another key: none is served the other's answer."""
    base, full = RetrievalRequest("q"), full_request()
    changed = {name: key_of(dataclasses.replace(base, **{name: getattr(full, name)})) for name in option_names()}
    assert sorted(name for name, key in changed.items() if key == key_of(base)) == sorted(CACHE_KEY_LEAVES_OUT)
    assert set(CACHE_KEY_LEAVES_OUT) <= set(option_names()) and all(CACHE_KEY_LEAVES_OUT.values())
