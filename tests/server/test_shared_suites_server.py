"""The store and retrieval integration suites of Milvus Lite, run again on a Milvus server.

The tests are imported from ``tests/stores/test_milvus.py`` and ``tests/rag/test_retrieve.py``
unchanged; only their data fixtures are replaced here, so the same corpus and the same
assertions meet the server's partition-key layout and its search paths. Tests about the Lite
file itself (its lock, reopening the file in a new process, a Lite file of their own) stay in
their suites.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
from pymilvus import MilvusClient

from strata.config import MilvusSettings, Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from strata.stores.milvus import LeafIndex
from tests.conftest import EXAMPLES_KB
from tests.rag import test_retrieve as retrieval_suite
from tests.rag.test_retrieve import (  # noqa: F401 - collected here, against the server
    test_encoder_failure_falls_back_to_bm25,
    test_filters_by_module_and_skill_point,
    test_hybrid_failure_retries_dense_only,
    test_hybrid_results_carry_metadata_and_trace,
    test_kbs_are_isolated_and_searchable_together,
    test_leaves_merge_to_l2_and_then_to_l1,
    test_rerank_failures_fall_back_to_fused_order,
    test_rerank_success_reorders_and_applies_min_score,
    test_unknown_kb_is_an_error_not_an_empty_kb,
)
from tests.server.conftest import fresh_collection, settled
from tests.stores import test_milvus as store_suite
from tests.stores.test_milvus import (  # noqa: F401 - collected here, against the server
    index,
    test_a_second_encoder_of_another_dimension_is_refused,
    test_both_kbs_searched_together,
    test_counts_per_kb_and_per_document,
    test_every_route_returns_only_the_requested_kb,
    test_scalar_filters_and_leaf_fields,
)

pytestmark = pytest.mark.milvus_server


@pytest.fixture(scope="module")
def server_collection(milvus_server_uri: str) -> Iterator[MilvusSettings]:
    """One collection on the server for this module's suites, dropped afterwards."""
    with fresh_collection(milvus_server_uri, "strata_suite") as settings:
        yield settings


@pytest.fixture(scope="module")
def filled(server_collection: MilvusSettings, memo_encoder: Any) -> tuple[MilvusSettings, dict[str, list[str]]]:
    """The store suite's corpus (two kbs of 500 leaves) written to the server."""
    index = LeafIndex(server_collection, encoder_name=memo_encoder.name, dim=memo_encoder.dim)
    corpus = store_suite._corpus()
    for kb_id, texts in corpus.items():
        leaves = [store_suite._leaf(kb_id, i, t) for i, t in enumerate(texts)]
        index.upsert(leaves, memo_encoder.encode_passages(texts), texts)
    index.flush()
    wanted = {kb: len(texts) for kb, texts in corpus.items()}
    assert settled(lambda: {kb: index.count(kb) for kb in corpus}, lambda c: c == wanted) == wanted
    index.close()
    return server_collection, corpus


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory, pg_url: str, memo_encoder: Any, milvus_server_uri: str) -> Settings:
    """The retrieval suite's kbs ('demo' from examples/kb, 'garden') indexed into the server and PostgreSQL."""
    root = tmp_path_factory.mktemp("retrieve-server")
    garden = root / "garden"
    garden.mkdir()
    (garden / "handbook.md").write_text(retrieval_suite.OTHER_KB_DOC, encoding="utf-8")
    milvus = {"uri": milvus_server_uri, "collection": f"strata_suite_{uuid.uuid4().hex[:12]}"}
    settings = retrieval_suite.make_settings(root, pg_url, milvus=milvus)
    resources = Resources(settings, encoder=memo_encoder)
    indexer = Indexer(resources)
    assert indexer.index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    assert indexer.index_paths([garden], kb_id="garden").failed == 0
    for kb in ("demo", "garden"):
        expected = resources.documents.stats(kb)["chunks_by_level"]["3"]
        assert settled(lambda kb=kb: resources.leaf_index.count(kb), lambda n, e=expected: n == e) == expected
    resources.close()
    yield settings
    _drop(milvus_server_uri, milvus["collection"])


def _drop(uri: str, collection: str) -> None:
    client = MilvusClient(uri=uri)
    try:
        if client.has_collection(collection):
            client.drop_collection(collection)
    finally:
        client.close()


def test_the_suites_ran_on_the_server_layout(filled: tuple[MilvusSettings, Any], indexed: Settings) -> None:
    """A guard: the fixtures above, not the Lite ones, fed the imported tests."""
    settings, _ = filled
    assert settings.uri == indexed.milvus.uri and indexed.milvus.collection.startswith("strata_suite_")
    if not settings.is_lite:
        assert Path(str(settings.uri)).suffix != ".db"
        client = MilvusClient(uri=str(settings.uri))
        try:
            fields = {f["name"]: f for f in client.describe_collection(indexed.milvus.collection)["fields"]}
        finally:
            client.close()
        assert fields["kb_id"].get("is_partition_key") is True
