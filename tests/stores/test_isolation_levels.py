"""Tenant isolation at each of Milvus's levels (``STRATA_MILVUS__ISOLATION``), on a Lite file and on the server.

The leak probe: tenant A indexes one document and reads its BM25 and dense scores and result ids for each of its
words; tenant B then indexes, in several runs, notes that hold two of A's words (each run flushes a segment of
its own: Milvus Lite merges a partition's segments once it holds four, as Milvus compacts). A reads again.

- ``collection``: A's scores and ids are unchanged (a collection's BM25 statistics are its own, on Lite and on
  Milvus standalone alike).
- ``partition``: unchanged on Milvus Lite, which keeps statistics per segment and segments per partition. On
  Milvus standalone or a cluster the statistics are per shard, across partitions (docs/deploy.md): this test
  proves the Lite behaviour only.
- ``partition_key``: B's kb is chosen to hash to A's bucket (Lite's md5 bucket); once B's segments are merged
  with A's, B's words score below A's other words in A's one document (where every word scored the same): A
  learns which words B wrote. The leak the level has, recorded here and in docs/deploy.md.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from strata.config import RedisSettings, load_settings
from strata.errors import StoreError
from strata.indexing.pipeline import Indexer
from strata.stores.leaf_index import LeafIndex, kb_collection_name
from strata.stores.milvus_connection import milvus_client
from strata.types import Chunk
from tests.support.documents import write_files
from tests.support.milvus import MilvusTarget
from tests.support.stores import opened

A_DOC = "# Field notes\n\nnightjar quenvit Contoso merger wibblefrotz\n"
SHARED, OWN = ("nightjar", "contoso"), ("quenvit", "merger", "wibblefrotz")
B_RUNS = 4  # B's uploads: enough segments for Lite to merge them with A's (it merges four of a size)


def lite_bucket(kb_id: str) -> int:
    """The partition-key bucket Milvus Lite routes ``kb_id`` to (md5 of the value, 16 buckets)."""
    return int(hashlib.md5(kb_id.encode()).hexdigest(), 16) % 16


def same_bucket_as(kb_id: str) -> str:
    return next(f"tenant-b-{i}" for i in range(1000) if lite_bucket(f"tenant-b-{i}") == lite_bucket(kb_id))


def scores(resources: Any, kb_id: str) -> dict[str, Any]:
    index = resources.leaf_index
    words = [*SHARED, *OWN]
    sparse = {
        w: [(h.chunk_id, round(h.score, 6)) for h in index.search_sparse(w, limit=5, kb_ids=[kb_id])] for w in words
    }
    vectors = resources.encoder.encode_queries(words)
    dense = index.search_dense_many(list(vectors), limit=5, kb_ids=[kb_id])
    return {
        "sparse": sparse,
        "dense": {w: [(h.chunk_id, round(h.score, 6)) for h in hits] for w, hits in zip(words, dense)},
    }


@pytest.mark.parametrize("level", ["collection", "partition", "partition_key"])
def test_a_tenants_scores_depend_on_another_tenants_words_only_at_the_partition_key_level(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings, memo_encoder: Any, level: str
) -> None:
    overrides = milvus_target.overrides()
    overrides.setdefault("milvus", {})["isolation"] = level
    settings = load_settings(
        data_dir=tmp_path / "data", redis=redis_settings.model_dump(), retrieval={"cache_size": 0}, **overrides
    )
    a_kb = "tenant-a"
    b_kb = same_bucket_as(a_kb)
    a_docs = write_files(tmp_path / "a", {"notes.md": A_DOC})
    with opened(settings, memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([a_docs], kb_id=a_kb)
        assert resources.leaf_index.isolation == level
        before = scores(resources, a_kb)
        assert all(before["sparse"][w] for w in (*SHARED, *OWN))
        for run in range(B_RUNS):
            b_docs = write_files(
                tmp_path / f"b{run}",
                {
                    f"memo{run}-{n}.md": (
                        f"# Memo {run}.{n}\n\nThe nightjar team met Contoso about item {run * 10 + n}.\n"
                    )
                    for n in range(3)
                },
            )
            indexer.index_paths([b_docs], kb_id=b_kb)
        after = scores(resources, a_kb)
        if level == "collection":
            client = milvus_client(settings.milvus)
            try:
                names = set(client.list_collections())
            finally:
                client.close()
            assert {kb_collection_name(settings.milvus.collection, kb) for kb in (a_kb, b_kb)} <= names
    assert after["dense"] == before["dense"]
    ids = {w: [i for i, _ in hits] for w, hits in before["sparse"].items()}
    assert {w: [i for i, _ in hits] for w, hits in after["sparse"].items()} == ids
    top = {w: hits[0][1] for w, hits in after["sparse"].items()}
    assert len({hits[0][1] for hits in before["sparse"].values()}) == 1  # one document: every word scores the same
    if level == "partition_key":  # the leak the level has: B's words now score below A's own in A's one document
        assert max(top[w] for w in SHARED) < min(top[w] for w in OWN), (before, after)
    else:
        assert after["sparse"] == before["sparse"]


def test_a_kb_collection_is_dropped_with_its_kb_and_a_query_over_kbs_in_several_collections_merges_them(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings, memo_encoder: Any
) -> None:
    overrides = milvus_target.overrides()
    overrides.setdefault("milvus", {})["isolation"] = "collection"
    settings = load_settings(
        data_dir=tmp_path / "data", redis=redis_settings.model_dump(), retrieval={"cache_size": 0}, **overrides
    )
    docs = {
        "one": write_files(
            tmp_path / "one", {"a.md": "# Sourdough\n\nA sourdough starter needs flour and water daily.\n"}
        ),
        "two": write_files(tmp_path / "two", {"b.md": "# Starter motors\n\nA starter motor turns the engine over.\n"}),
    }
    with opened(settings, memo_encoder) as resources:
        indexer = Indexer(resources)
        for kb, folder in docs.items():
            indexer.index_paths([folder], kb_id=kb)
        index = resources.leaf_index
        both = index.search_sparse("starter", limit=10, kb_ids=["one", "two"])
        assert {h.chunk_id for h in both} == {
            h.chunk_id for kb in ("one", "two") for h in index.search_sparse("starter", limit=10, kb_ids=[kb])
        }
        assert [h.score for h in both] == sorted((h.score for h in both), reverse=True)
        indexer.drop_kb("two")
        client = milvus_client(settings.milvus)
        try:
            names = set(client.list_collections())
        finally:
            client.close()
        assert kb_collection_name(settings.milvus.collection, "two") not in names
        assert kb_collection_name(settings.milvus.collection, "one") in names
        assert index.count("two") == 0 and index.search_sparse("starter", limit=10, kb_ids=["two"]) == []
        assert {h.chunk_id for h in index.search_sparse("starter", limit=10, kb_ids=["one", "two"])} == {
            h.chunk_id for h in index.search_sparse("starter", limit=10, kb_ids=["one"])
        }


@pytest.mark.parametrize("level", ["collection", "partition"])
def test_a_kb_past_the_levels_limit_is_refused_before_milvus_would(
    tmp_path: Path, milvus_target: MilvusTarget, memo_encoder: Any, level: str
) -> None:
    limit = {"max_collections": 2} if level == "collection" else {"max_partitions": 2}
    settings = milvus_target.settings(tmp_path).model_copy(update={"isolation": level, **limit})
    index = LeafIndex(settings, encoder_name=memo_encoder.name, dim=memo_encoder.dim)
    try:
        texts = ["one leaf of this kb"]
        vectors = memo_encoder.encode_passages(texts)
        for kb in ("k1", "k2"):
            index.upsert([_leaf(kb, texts[0])], vectors, texts)
        setting = "MAX_COLLECTIONS" if level == "collection" else "MAX_PARTITIONS"
        with pytest.raises(StoreError, match=f"knowledge base 'k3' would be .* 3 .*STRATA_MILVUS__{setting} \\(2"):
            index.upsert([_leaf("k3", texts[0])], vectors, texts)
        index.flush()
        assert [index.count(kb) for kb in ("k1", "k2", "k3")] == [1, 1, 0]
    finally:
        index.drop_collection()
        index.close()


def _leaf(kb_id: str, text: str) -> Chunk:
    return Chunk(
        chunk_id=f"{kb_id}-0",
        kb_id=kb_id,
        doc_id="d.md",
        version=1,
        level=3,
        parent_id=f"{kb_id}-p",
        root_id=f"{kb_id}-r",
        ordinal=0,
        text=text,
        heading_path="",
        char_start=0,
        char_end=len(text),
        metadata={},
    )
