"""Fixtures shared by the rag tests: examples/kb in stores of its own, a real local rerank service."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from strata.config import Settings
from tests.rag.rerank_server import RerankServer
from tests.support.processes import free_port
from tests.support.stores import examples_kb


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, memo_encoder: Any) -> Settings:
    """The settings of ``examples_kb``, once per test module."""
    return examples_kb(tmp_path_factory.mktemp("demo"), memo_encoder).settings


@pytest.fixture
def rerank_server() -> Iterator[RerankServer]:
    """A running ``RerankServer`` answering correctly in the jina format until told otherwise."""
    with RerankServer() as server:
        yield server


@pytest.fixture
def refused_url() -> str:
    """A rerank URL on 127.0.0.1 where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{free_port()}/v1/rerank"
