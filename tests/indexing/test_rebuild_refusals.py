"""An in-place ``strata rebuild`` is refused, before it deletes anything, by every check the other commands make.

A kb indexed at the ``collection`` level (its collection of its own: the level where a rebuild in place drops
the collection) into a Milvus Lite file and SQLite under ``tmp_path``, then rebuilt in place under a setting
that contradicts what it was built with: a stray analyzer, another isolation level, another encoder. Each
rebuild raises the error the other commands raise, and the kb's collection, its analyzer and its leaves
are as they were.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pymilvus import MilvusClient

from strata.config import ConfigError, Settings
from strata.errors import EncoderMismatchError, StoreError
from strata.indexing.pipeline import Indexer
from strata.indexing.rebuild import Rebuilder
from strata.stores.leaf_index import kb_collection_name
from strata.stores.leaf_schema import analyzer_identity, analyzer_of
from tests.support.stores import make_settings, opened, own_db, with_sections

pytestmark = [pytest.mark.integration, pytest.mark.cost(25)]

KB = "notes"


@dataclass(frozen=True)
class Renamed:
    """The test's encoder under another name: a kb built by it is another encoder's."""

    inner: Any
    name: str = "another-encoder"

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self.inner, attribute)


def _state(settings: Settings, encoder: Any) -> tuple[int, dict[str, Any] | None]:
    """The kb's leaves in Milvus and the analyzer its collection was built with."""
    with opened(settings, encoder) as resources:
        leaves = resources.leaf_index.count(KB)
    client = MilvusClient(uri=str(settings.milvus.uri))
    try:
        built = analyzer_of(client.describe_collection(kb_collection_name(settings.milvus.collection, KB)))
    finally:
        client.close()
    return leaves, analyzer_identity(built) if built else None


@pytest.mark.parametrize(
    ("breach", "error", "named"),
    [
        ({"milvus": {"analyzer": {"tokenizer": "standard"}}}, ConfigError, "STRATA_MILVUS__ANALYZER"),
        ({"milvus": {"isolation": "partition"}}, StoreError, "STRATA_MILVUS__ISOLATION"),
        ("encoder", EncoderMismatchError, "another-encoder"),
    ],
    ids=["analyzer", "isolation", "encoder"],
)
def test_in_place_rebuild_is_refused_before_anything_is_dropped(
    tmp_path: Path, memo_encoder: Any, breach: Any, error: type[Exception], named: str
) -> None:
    settings = make_settings(tmp_path, own_db(tmp_path / "db"), redis_url=None, milvus={"isolation": "collection"})
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("ferry", "quay"):
        (docs / f"{name}.md").write_text(f"# {name}\n\nThe {name} opens at dawn; 渡口清晨开放。\n", encoding="utf-8")
    with opened(settings, memo_encoder) as resources:
        assert Indexer(resources).index_paths([docs], kb_id=KB).added == 2
    before = _state(settings, memo_encoder)
    assert before[0] > 0 and before[1] == {"tokenizer": "jieba"}

    stray, encoder = (settings, Renamed(memo_encoder)) if breach == "encoder" else (settings, memo_encoder)
    if isinstance(breach, dict):
        stray = with_sections(settings, **breach)
    with opened(stray, encoder) as resources, pytest.raises(error, match=named):
        Rebuilder(resources).rebuild(KB)
    assert _state(settings, memo_encoder) == before
