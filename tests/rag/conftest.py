"""Fixtures shared by the rag tests: a real local rerank service."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.rag.rerank_server import RerankServer, unused_port


@pytest.fixture
def rerank_server() -> Iterator[RerankServer]:
    """A running ``RerankServer`` answering correctly in the jina format until told otherwise."""
    with RerankServer() as server:
        yield server


@pytest.fixture
def refused_url() -> str:
    """A rerank URL on 127.0.0.1 where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{unused_port()}/v1/rerank"
