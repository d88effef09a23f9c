"""A long-lived process answers honestly: new kbs are seen, outages are not served as answers.

Real Milvus Lite, PostgreSQL and Redis; faults are real (a refused SQL
connection, a hanging HTTP server, a paused Redis).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from strata.config import Settings
from strata.encoders.openai_http import OpenAIEmbeddingEncoder
from strata.errors import EncoderError
from strata.indexing.embedding import search_text
from strata.indexing.pipeline import Indexer
from strata.rag.fingerprint import config_fingerprint
from strata.rag.retrieve import DEFAULT_ENGINES, Retriever, close_default_engines, default_engine
from strata.resources import Resources
from strata.stores.sql import DocumentVersion
from tests.rag.rerank_server import RerankServer, hang, raw
from tests.support.documents import GARDEN, RESET_QUERY, write
from tests.support.fakes import RejectingSparseIndex
from tests.support.paths import EXAMPLES_KB
from tests.support.retrieval import retriever
from tests.support.stores import REDIS_URL, cut_sql, make_settings, own_db

# -- item 6: a kb created after the process opened the index -------------------------


def test_a_kb_indexed_by_another_resources_after_the_first_query_is_found(
    tmp_path: Path, pg_url: str, memo_encoder
) -> None:
    settings = make_settings(tmp_path, own_db(tmp_path), redis_url=None)
    serving = Resources(settings, encoder=memo_encoder)
    Indexer(serving).index_paths([EXAMPLES_KB], kb_id="demo")
    service = Retriever(serving)
    assert service.retrieve(RESET_QUERY, 3, kb_ids=["demo"]).docs  # the index lists its partitions now

    Indexer(Resources(settings, encoder=memo_encoder)).index_paths(
        [write(tmp_path / "g", "garden.md", GARDEN)], kb_id="other"
    )
    result = service.retrieve("tomatoes watering", 3, kb_ids=["other"])

    assert result.meta.status == "ok" and result.docs
    assert "Tomatoes" in result.docs[0].content

    # the stale index also deletes from the new kb's partition (no orphan leaves) and counts it
    assert serving.leaf_index.count("other") > 0
    assert Indexer(serving).delete_document("other", "garden.md")
    assert Resources(settings, encoder=memo_encoder).leaf_index.count("other") == 0


# -- item 7: SQL down ----------------------------------------------------------------------


@pytest.fixture
def half_written(tmp_path: Path, pg_url: str, memo_encoder) -> Settings:
    """kb 'half': doc a.md v1 active, and a v2 written to SQL and Milvus as pending (a crash before activation)."""
    settings = make_settings(tmp_path, own_db(tmp_path), redis_url=None)
    resources = Resources(settings, encoder=memo_encoder)
    Indexer(resources).index_paths(
        [write(tmp_path / "half", "a.md", "# Old\n\nThe old launch code is ALPHA-1.\n")], kb_id="half"
    )
    pending = "# New\n\nThe pending launch code is OMEGA-9, not yet released.\n"
    from strata.indexing.chunking import chunk_document
    from strata.indexing.loaders import load_document

    doc = load_document(write(tmp_path / "next", "a.md", pending) / "a.md", root=tmp_path / "next")
    chunks = chunk_document(doc, kb_id="half", version=2, settings=settings.chunking)
    leaves = [c for c in chunks if c.is_leaf]
    texts = [search_text(c, True) for c in leaves]
    resources.documents.versions.write_pending(
        DocumentVersion("half", "a.md", 2, "a.md", "h2", leaf_count=len(leaves)), chunks
    )
    resources.leaf_index.upsert(leaves, memo_encoder.encode_passages(texts), texts)
    resources.leaf_index.flush()
    return settings


def test_sql_down_serves_the_last_seen_state_never_a_pending_version(half_written: Settings, memo_encoder) -> None:
    resources = Resources(half_written, encoder=memo_encoder)
    service = Retriever(resources)
    assert "OMEGA" not in " ".join(d.content for d in service.retrieve("launch code", 5, kb_ids=["half"]).docs)

    cut_sql(resources)
    result = service.retrieve("pending launch code OMEGA", 5, kb_ids=["half"])

    assert result.meta.status == "degraded" and "serving_state_stale" in result.meta.degraded
    assert result.docs and all("OMEGA" not in d.content for d in result.docs)


def test_sql_down_without_a_state_seen_fails_with_the_reason(half_written: Settings, memo_encoder) -> None:
    resources = Resources(half_written, encoder=memo_encoder)
    _ = resources.leaf_index
    cut_sql(resources)

    result = Retriever(resources).retrieve("pending launch code OMEGA", 5, kb_ids=["half"])

    assert result.docs == () and (result.meta.status, result.meta.mode) == ("failed", "failed")
    assert "serving_state_unavailable" in result.meta.degraded
    assert "refusing to serve" in result.meta.errors[0].message


# -- items 8 and 9: the query cache ------------------------------------------------------


def cached_settings(root: Path, pg_url: str, **redis: Any) -> Settings:
    settings = make_settings(root, own_db(root), redis_url=REDIS_URL)
    return settings.model_copy(
        update={
            "retrieval": settings.retrieval.model_copy(update={"cache_size": 64}),
            "redis": settings.redis.model_copy(update=redis),
        }
    )


def test_two_deployments_sharing_one_redis_prefix_never_share_entries(
    tmp_path: Path, pg_url: str, memo_encoder
) -> None:
    prefix = f"strata-test-{uuid.uuid4().hex[:8]}"  # the same prefix for both, as with the default
    one = cached_settings(tmp_path / "one", pg_url, key_prefix=prefix)
    two = cached_settings(tmp_path / "two", pg_url, key_prefix=prefix)
    two = two.model_copy(update={"milvus": two.milvus.model_copy(update={"collection": "other_leaves"})})
    Indexer(Resources(one, encoder=memo_encoder)).index_paths([write(tmp_path / "a", "x.md", GARDEN)], kb_id="kb")
    Indexer(Resources(two, encoder=memo_encoder)).index_paths(
        [write(tmp_path / "b", "x.md", "# Roses\n\nRoses want watering at the roots, twice a week.\n")], kb_id="kb"
    )
    try:
        first = Retriever(Resources(one, encoder=memo_encoder)).retrieve("watering twice a week", 3, kb_ids=["kb"])
        second = Retriever(Resources(two, encoder=memo_encoder)).retrieve("watering twice a week", 3, kb_ids=["kb"])
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        client.delete(*client.scan_iter(match=f"{prefix}:*")) if list(client.scan_iter(match=f"{prefix}:*")) else None
    assert (first.meta.cache, second.meta.cache) == ("miss", "miss")
    assert "Tomatoes" in first.docs[0].content and "Roses" in second.docs[0].content


def test_the_cache_key_covers_chunking_rerank_and_store_identity() -> None:
    base = Settings(_env_file=None)
    changed = {
        "chunking": base.chunking.model_copy(update={"l3_max_chars": 99}),
        "rerank": base.rerank.model_copy(update={"model": "other", "top_n": 3, "provider": "tei"}),
        "milvus": base.milvus.model_copy(update={"uri": "http://milvus:19530"}),
        "database": base.database.model_copy(update={"url": "postgresql+psycopg://u:secret@db/strata"}),
        "redis": base.redis.model_copy(update={"key_prefix": "team-b"}),
    }
    for name, section in changed.items():
        assert config_fingerprint(base.model_copy(update={name: section})) != config_fingerprint(base), name
    not_deciding = base.retrieval.model_copy(update={"cache_size": 7, "cache_ttl_s": 9})
    assert config_fingerprint(base.model_copy(update={"retrieval": not_deciding})) == config_fingerprint(base)
    assert "secret" not in str(config_fingerprint(base.model_copy(update={"database": changed["database"]})))


def test_a_paused_redis_shows_in_the_meta_record_and_costs_one_timeout(
    tmp_path: Path, pg_url: str, memo_encoder, private_redis
) -> None:
    settings = cached_settings(tmp_path, pg_url, url=private_redis.url, socket_timeout_s=0.3)
    resources = Resources(settings, encoder=memo_encoder)
    Indexer(resources).index_paths([write(tmp_path / "g", "garden.md", GARDEN)], kb_id="g")
    service = Retriever(resources)
    private_redis.pause()
    try:
        first = service.retrieve("deep watering", 3, kb_ids=["g"])
        second = service.retrieve("morning watering", 3, kb_ids=["g"])
    finally:
        private_redis.resume()
    for result in (first, second):
        assert result.docs and result.meta.status == "degraded"
        assert "query_cache_unavailable" in result.meta.degraded
    assert any("Timeout" in e.message for e in first.meta.errors if e.stage == "query_cache")
    assert any("bypassed" in e.message for e in second.meta.errors if e.stage == "query_cache")


# -- item 10: one Retriever per configuration, secrets included; close releases clients --------


def test_settings_differing_only_by_a_secret_get_their_own_retriever(tmp_path: Path) -> None:
    base = Settings(_env_file=None, data_dir=tmp_path)
    one = base.model_copy(update={"rerank": base.rerank.model_copy(update={"api_key": SecretStr("token-one")})})
    two = base.model_copy(update={"rerank": base.rerank.model_copy(update={"api_key": SecretStr("token-two")})})
    assert one.model_dump_json() == two.model_dump_json()  # pydantic masks both as **********
    assert default_engine(one) is not default_engine(two)
    assert default_engine(one) is default_engine(one.model_copy())


def test_default_engines_are_bounded_and_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The least recently used default engine is closed when another configuration needs room; the rest at exit."""
    closed: list[Retriever] = []
    close = Retriever.close
    monkeypatch.setattr(Retriever, "close", lambda self: (closed.append(self), close(self)))
    close_default_engines()
    closed.clear()
    base = Settings(_env_file=None, data_dir=tmp_path)
    configs = [
        base.model_copy(update={"rerank": base.rerank.model_copy(update={"api_key": SecretStr(f"t{i}")})})
        for i in range(DEFAULT_ENGINES + 1)
    ]
    engines = [default_engine(c) for c in configs[:DEFAULT_ENGINES]]
    assert default_engine(configs[0]) is engines[0] and not closed  # now the most recently used
    newest = default_engine(configs[-1])
    assert closed == [engines[1]]  # the least recently used, closed
    assert default_engine(configs[1]) is not engines[1]  # built afresh (closing engines[2])
    close_default_engines()
    assert {id(e) for e in closed} >= {id(engines[0]), id(newest)} and len(closed) == DEFAULT_ENGINES + 2


def test_close_releases_the_redis_and_http_clients(tmp_path: Path, pg_url: str, memo_encoder, private_redis) -> None:
    settings = cached_settings(tmp_path, pg_url, url=private_redis.url)
    with RerankServer() as rerank:
        settings = settings.model_copy(update={"rerank": settings.rerank.model_copy(update={"url": rerank.url})})
        resources = Resources(settings, encoder=memo_encoder)
        report = Indexer(resources).index_paths([write(tmp_path / "g", "garden.md", GARDEN)], kb_id="g")
        assert report.failed == 0, report.failures
        service = Retriever(resources)
        answered = service.retrieve("deep watering", 3, kb_ids=["g"])
        assert answered.meta.rerank.status == "applied", (
            answered.meta.rerank,
            answered.meta.dense_candidates,
            answered.meta.sparse_candidates,
            answered.meta.fused_candidates,
        )
        observer = redis.Redis(port=private_redis.port)
        assert len(observer.client_list()) > 1
        service.close()
        resources.close()
        assert len(observer.client_list()) == 1  # only the observer itself
        assert service.reranker._client.is_closed


# -- item 11: fallback switches and one threshold ------------------------------------------


def test_fallbacks_switched_off_mean_a_failed_answer_not_bm25(tmp_path: Path, pg_url: str, memo_encoder) -> None:
    settings = make_settings(
        tmp_path, own_db(tmp_path), redis_url=None, retrieval={"dense_fallback": False, "sparse_fallback": False}
    )
    resources = Resources(settings, encoder=memo_encoder)
    Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo")
    result = retriever(settings, memo_encoder, leaf_index=RejectingSparseIndex(resources.leaf_index)).retrieve(
        RESET_QUERY, 5, kb_ids=["demo"]
    )
    assert result.docs == () and (result.meta.status, result.meta.mode) == ("failed", "failed")
    assert result.meta.sparse_candidates == 0 and "hybrid_search_failed" in result.meta.degraded


def test_min_fused_score_means_the_same_on_hybrid_and_on_the_fallback(
    tmp_path: Path, pg_url: str, memo_encoder
) -> None:
    settings = make_settings(
        tmp_path, own_db(tmp_path), redis_url=None, retrieval={"min_fused_score": 0.75, "merge_enabled": False}
    )
    resources = Resources(settings, encoder=memo_encoder)
    Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo")
    hybrid = retriever(settings, memo_encoder).retrieve(RESET_QUERY, 5, kb_ids=["demo"])
    fallback = retriever(settings, memo_encoder, leaf_index=RejectingSparseIndex(resources.leaf_index)).retrieve(
        RESET_QUERY, 5, kb_ids=["demo"]
    )
    assert fallback.meta.mode == "dense_fallback"
    for result in (hybrid, fallback):
        assert result.docs and all(0.75 <= d.score <= 1.0 for d in result.docs)
        assert result.meta.returned + result.meta.dropped_by_min_score == 5
    assert fallback.docs[0].score == pytest.approx(1.0)  # first on the only route that ran


# -- items 12 and 14: query-path timeouts and bounded inputs ------------------------------------


def test_a_hanging_embeddings_server_costs_a_query_one_short_timeout() -> None:
    with RerankServer(path="/v1/embeddings") as server:
        server.behaviour = hang(5.0, then=raw("{}"))
        encoder = OpenAIEmbeddingEncoder(
            server.base_url + "/v1", "e5", timeout_s=30, max_retries=3, query_timeout_s=0.3
        )
        encoder._dim = 384
        with pytest.raises(EncoderError, match="Timeout"):
            encoder.encode_queries(["a query"])
        assert len(server.requests) == 1  # the read timeout is not retried on the query path


@pytest.mark.parametrize(
    ("query", "top_k", "named"),
    [
        ("x" * 2001, 5, "STRATA_RETRIEVAL__MAX_QUERY_CHARS"),
        ("ok", 51, "STRATA_RETRIEVAL__MAX_TOP_K"),
        ("ok", 0, "MAX_TOP_K"),
        ("  ", 5, "non-empty"),
        ("ok", "5", "integer"),
    ],
)
def test_bad_arguments_are_value_errors_naming_the_limit(tmp_path: Path, query: str, top_k: Any, named: str) -> None:
    service = Retriever(Resources(Settings(_env_file=None, data_dir=tmp_path)))
    with pytest.raises(ValueError, match=named):
        service.retrieve(query, top_k)
    assert not (tmp_path / "milvus.db").exists()  # refused before any store was opened
