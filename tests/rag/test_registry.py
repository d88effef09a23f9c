"""The retriever registry: strata's strategies and a custom retriever, fused on a real index."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from strata.config import ConfigError, Settings
from strata.rag.registry import (
    RetrieverProtocol,
    StrategyRetriever,
    available_retrievers,
    get_retriever,
    register_retriever,
    retrieve_fused,
)
from strata.strategy_table import STRATEGIES
from strata.types import Filters, RetrievalMeta, RetrievalResult, RetrievedDocument
from tests.integrations.kb import engine, index_demo_and_garden
from tests.support.documents import RESET_QUERY

HANDBOOK = "Password reset links from the partner wiki expire after one hour."


@dataclass(frozen=True)
class WikiRetriever:
    """A user's own retriever: a fixed 'wiki' that answers every query with its pages."""

    pages: tuple[str, ...]
    name: str = "wiki"
    strategy: str = "keyword"

    def retrieve(self, query: str, top_k: int = 5, **kw: Any) -> RetrievalResult:
        docs = tuple(RetrievedDocument(p, 1.0 / (i + 1), {"source": f"wiki/{i}"}) for i, p in enumerate(self.pages))
        meta = RetrievalMeta(query=query, top_k=top_k, candidate_k=top_k, returned=min(top_k, len(docs)))
        return RetrievalResult(docs[:top_k], meta)


@pytest.fixture
def wiki(retriever_registry: None) -> str:
    register_retriever("wiki", lambda **config: WikiRetriever(**config))
    return "wiki"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory, memo_encoder) -> Settings:
    return index_demo_and_garden(tmp_path_factory.mktemp("registry"), memo_encoder)


def test_strata_strategies_are_registered_by_name() -> None:
    # written out, not read from STRATEGIES (the registry registers from that table: it would check itself)
    assert available_retrievers() == ("adjacent", "auto_merge", "basic", "fusion", "hybrid")
    assert set(STRATEGIES) == set(available_retrievers())  # and a new strategy is registered with the table
    auto = get_retriever("auto_merge", kb_ids=["demo"])
    assert isinstance(auto, RetrieverProtocol) and isinstance(auto, StrategyRetriever)
    assert (auto.name, auto.strategy, auto.kb_ids) == ("auto_merge", "auto_merge", ("demo",))


def test_a_custom_retriever_is_found_by_name_with_its_config(wiki: str) -> None:
    found = get_retriever(wiki, pages=("one", "two"))

    assert wiki in available_retrievers()
    assert [d.content for d in found.retrieve("anything", 1).docs] == ["one"]


def test_unknown_names_and_duplicates_are_refused(wiki: str) -> None:
    with pytest.raises(ConfigError, match=r"unknown retriever 'nope'; registered: .*auto_merge.*wiki"):
        get_retriever("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_retriever(wiki, lambda **config: WikiRetriever(("x",)))
    register_retriever(wiki, lambda **config: WikiRetriever(("replaced",)), replace=True)
    assert get_retriever(wiki).retrieve("q").docs[0].content == "replaced"


def test_a_factory_that_builds_no_retriever_is_an_error(retriever_registry: None) -> None:
    register_retriever("broken", lambda **config: object())
    with pytest.raises(TypeError, match="not a RetrieverProtocol"):
        get_retriever("broken")


class RecordingEngine:
    """Stands in for strata's ``Retriever`` and records the arguments it was called with."""

    def __init__(self, *, takes_strategy: bool) -> None:
        self.calls: list[dict[str, Any]] = []
        if takes_strategy:
            self.retrieve = self._with_strategy  # type: ignore[method-assign]

    def retrieve(self, query: str, top_k: int = 5, *, kb_ids: Any = None, filters: Any = None) -> RetrievalResult:
        self.calls.append({"query": query, "top_k": top_k, "kb_ids": kb_ids, "filters": filters})
        return RetrievalResult((), RetrievalMeta(query=query, top_k=top_k, candidate_k=top_k))

    def _with_strategy(
        self, query: str, top_k: int = 5, *, kb_ids: Any = None, filters: Any = None, strategy: str = "auto_merge"
    ) -> RetrievalResult:
        self.calls.append({"query": query, "top_k": top_k, "kb_ids": kb_ids, "filters": filters, "strategy": strategy})
        return RetrievalResult((), RetrievalMeta(query=query, top_k=top_k, candidate_k=top_k))


def test_the_strategy_kbs_and_filters_reach_the_engine() -> None:
    engine_ = RecordingEngine(takes_strategy=True)
    auth = Filters(modules=("auth",))
    get_retriever("adjacent", engine=engine_, kb_ids=["demo"]).retrieve("q", 3, filters=auth)
    get_retriever("auto_merge", engine=engine_).retrieve("q", 2, kb_ids=["garden"])
    assert engine_.calls == [
        {"query": "q", "top_k": 3, "kb_ids": ["demo"], "filters": auth, "strategy": "adjacent"},
        {"query": "q", "top_k": 2, "kb_ids": ["garden"], "filters": None, "strategy": "auto_merge"},
    ]


def test_a_custom_retrievers_results_fuse_with_strata_by_rrf(indexed: Settings, memo_encoder, wiki: str) -> None:
    ours = get_retriever("auto_merge", kb_ids=["demo"], engine=engine(indexed, memo_encoder))
    theirs = get_retriever(wiki, pages=(HANDBOOK, "Gardening tips."))

    fused = retrieve_fused([ours, theirs], RESET_QUERY, top_k=4)

    strata_result, _wiki_result = fused.results
    assert strata_result.meta.status == "ok" and strata_result.docs
    assert len(fused.docs) == 4
    top_two = {d.content for d in fused.docs[:2]}
    assert top_two == {strata_result.docs[0].content, HANDBOOK}  # each list's first, tied at 1/61
    assert "30 分钟" in strata_result.docs[0].content
    for doc in fused.docs:
        ranks = doc.metadata["fusion"]["ranks"]
        assert doc.score == pytest.approx(sum(1 / (60 + r) for r in ranks if r is not None))
    assert [d.score for d in fused.docs] == sorted((d.score for d in fused.docs), reverse=True)


def test_strata_strategy_over_retrieve_documents_honours_kb_ids(indexed: Settings) -> None:
    """Without an engine, the strategy calls ``retrieve_documents`` with the given settings."""
    garden = get_retriever("auto_merge", kb_ids=["garden"], settings=indexed).retrieve("how often to water tomatoes", 3)

    assert garden.meta.status == "ok" and garden.docs
    assert {d.metadata["kb_id"] for d in garden.docs} == {"garden"}
