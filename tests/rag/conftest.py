"""Fixtures shared by the rag tests: examples/kb in stores of its own, a real local rerank service."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from backend.config import Settings
from backend.indexing.pipeline import Indexer
from backend.resources import Resources
from tests.conftest import EXAMPLES_KB
from tests.rag.rerank_server import RerankServer, unused_port
from tests.rag.test_retrieve import make_settings


def examples_kb(root: Path, encoder: Any) -> Settings:
    """examples/kb indexed as kb 'demo' into stores of its own under ``root`` (SQLite, Milvus Lite, in-process cache)."""
    settings = make_settings(root, f"sqlite:///{root / 'strata.sqlite3'}", redis_url=None)
    assert Indexer(Resources(settings, encoder=encoder)).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    return settings


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, memo_encoder: Any) -> Settings:
    """``examples_kb`` once per test module."""
    return examples_kb(tmp_path_factory.mktemp("demo"), memo_encoder)


@pytest.fixture
def rerank_server() -> Iterator[RerankServer]:
    """A running ``RerankServer`` answering correctly in the jina format until told otherwise."""
    with RerankServer() as server:
        yield server


@pytest.fixture
def refused_url() -> str:
    """A rerank URL on 127.0.0.1 where nothing listens (connection refused)."""
    return f"http://127.0.0.1:{unused_port()}/v1/rerank"
