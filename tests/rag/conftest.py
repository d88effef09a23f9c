"""Fixtures shared by the rag tests: examples/kb in stores of its own, a real local rerank service."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.conftest import EXAMPLES_KB, MilvusTarget
from tests.rag.rerank_server import RerankServer, unused_port
from tests.strata_support import make_settings


def examples_kb(root: Path, encoder: Any, target: MilvusTarget = MilvusTarget("lite")) -> Resources:
    """examples/kb indexed as kb 'demo' into stores of its own under ``root`` (SQLite, the Milvus of
    ``target``, in-process cache), by the ``Resources`` returned: a test that serves from them keeps the
    same Milvus Lite client open throughout."""
    settings = make_settings(root, f"sqlite:///{root / 'strata.sqlite3'}", redis_url=None, **target.overrides())
    resources = Resources(settings, encoder=encoder)
    assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    return resources


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
    return f"http://127.0.0.1:{unused_port()}/v1/rerank"
