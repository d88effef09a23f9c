"""``StrataClient`` over real HTTP (uvicorn on loopback, in a thread) against the in-process library."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest
import uvicorn

from strata.api import create_app
from strata.client import ServiceError, StrataClient
from strata.config import ApiKeyGrant, Settings
from strata.errors import NotFoundError
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.types import Filters
from tests.api.conftest import KEYS
from tests.conftest import free_port

RESET_QUERY = "密码重置链接多久失效？"


@pytest.fixture(scope="module")
def served_url(stores: tuple[Settings, Resources]) -> Iterator[str]:
    base, resources = stores
    api = base.api.model_copy(update={"keys": {k: ApiKeyGrant(**v) for k, v in KEYS.items()}})
    settings = base.model_copy(update={"api": api, "retrieval": base.retrieval.model_copy(update={"cache_size": 0})})
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings, resources=resources), host="127.0.0.1", port=port, log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


def test_the_client_returns_what_the_library_returns(served_url: str, stores: tuple[Settings, Resources]) -> None:
    with StrataClient(served_url, "admin-key") as client:
        remote = client.retrieve_documents(RESET_QUERY, 3, kb_ids=["demo"], filters=Filters(modules=("auth",)))
    local = Retriever(stores[1]).retrieve(RESET_QUERY, 3, kb_ids=["demo"], filters=Filters(modules=("auth",)))
    assert [d.metadata["chunk_id"] for d in remote.docs] == [d.metadata["chunk_id"] for d in local.docs]
    assert [d.content for d in remote.docs] == [d.content for d in local.docs]
    assert [round(d.score, 9) for d in remote.docs] == [round(d.score, 9) for d in local.docs]
    assert remote.docs[0].metadata["trace"] == local.docs[0].metadata["trace"]
    assert (remote.meta.status, remote.meta.mode, remote.meta.kb_ids, remote.meta.filters) == (
        local.meta.status, local.meta.mode, local.meta.kb_ids, local.meta.filters,
    )  # fmt: skip


def test_the_client_raises_like_the_library(served_url: str) -> None:
    with StrataClient(served_url, "demo-reader-key") as client:
        with pytest.raises(ValueError, match="top_k"):
            client.retrieve_documents("x", 0)
        with pytest.raises(NotFoundError, match="garden"):
            client.retrieve_documents("tomatoes", 3, kb_ids=["garden"])  # not this key's: as if it did not exist
        assert {k["kb_id"] for k in client.list_kbs()} == {"demo"}
    with StrataClient(served_url, "wrong-key") as client, pytest.raises(ServiceError) as refused:
        client.retrieve_documents("x", 3)
    assert refused.value.status == 401 and refused.value.problem["title"] == "Unauthorized"
    with StrataClient(f"http://127.0.0.1:{free_port()}") as client, pytest.raises(ServiceError, match="cannot reach"):
        client.retrieve_documents("x", 3)
