"""BM25 query hygiene, the pure part: pruning by document frequency and the per-generation statistics cache."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from strata.rag.bm25_hygiene import FrequentTermsCache, prune_bm25_query, query_terms
from strata.stores.analyzer import analyzer_tokenizer
from strata.stores.term_stats import TermFrequencies

# A fake analyzer in the manner of jieba's search mode: a compound yields its parts, then itself.
COMPOUNDS = {"twofactor": ["two", "factor"]}


def tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    for word in text.lower().replace("?", " ? ").replace(",", " , ").split():
        tokens += [*COMPOUNDS.get(word, []), word]
    return tokens


def prune(text: str, df: dict[str, int], leaves: int = 100, max_df: float = 0.5):  # noqa: ANN201
    return prune_bm25_query(text, tokenize=tokenize, df=df, leaves=leaves, max_df=max_df)


def test_punctuation_and_terms_in_most_leaves_are_left_out_in_query_order() -> None:
    df = {"what": 70, "is": 90, "the": 99, "warranty": 3, "period": 8, "of": 95}
    pruned = prune("What is the warranty period, of the blender?", df)
    assert pruned.text == "warranty period blender"
    assert pruned.dropped == ("what", "is", "the", ",", "of", "?")


def test_a_query_without_common_terms_is_searched_exactly_as_given() -> None:
    query = "Warranty  PERIOD blender"
    assert prune(query, {"warranty": 3, "period": 50}) == prune_bm25_query(
        query, tokenize=tokenize, df={}, leaves=100, max_df=0.5
    )
    assert prune(query, {"warranty": 3, "period": 50}).text == query  # df/N equal to max_df is kept
    assert prune(query, {"warranty": 3, "period": 50}).dropped == ()


def test_when_every_term_is_common_the_rarest_word_is_kept() -> None:
    pruned = prune("the what ?", {"the": 99, "what": 60, "?": 1})
    assert pruned.text == "what" and pruned.dropped == ("the", "?")
    assert prune("? ,", {}).text == "?"  # punctuation only: the first token, never an empty query


def test_a_dropped_part_of_a_kept_compound_is_searched_after_all_and_not_reported() -> None:
    pruned = prune("twofactor factor setup ?", {"factor": 80, "two": 10, "setup": 5})
    assert pruned.text == "twofactor setup"  # "two" and "factor" come back from "twofactor": written once
    assert pruned.dropped == ("?",)
    assert query_terms(pruned.text, tokenize) == ["two", "factor", "twofactor", "setup"]


def test_jieba_queries_lose_their_common_words_and_punctuation() -> None:
    jieba = analyzer_tokenizer({"tokenizer": "jieba"})
    query = "密码重置链接的有效期是什么？"
    df = {"的": 950, "是": 800, "什么": 600, "密码": 40, "重置": 30, "链接": 90, "有效期": 12}
    pruned = prune_bm25_query(query, tokenize=jieba, df=df, leaves=1000, max_df=0.5)
    assert pruned.dropped == ("的", "是", "什么", "？")
    searched = set(jieba(pruned.text))
    assert {"密码", "重置", "链接", "有效期"} <= searched and not searched & {"的", "是", "什么", "？"}


# -- the per-generation cache ------------------------------------------------------


class CountingLookup:
    """A source of frequent-term statistics that records every question."""

    def __init__(self, leaves: int = 500, df: dict[str, int] | None = None) -> None:
        self.leaves, self.df = leaves, df or {}
        self.calls: list[tuple[tuple[str, ...], float]] = []
        self.fail = False

    def __call__(self, kbs: Sequence[str], max_df: float, timeout_s: float | None) -> TermFrequencies:
        self.calls.append((tuple(kbs), max_df))
        if self.fail:
            raise RuntimeError("database is down")
        return TermFrequencies(self.leaves, {t: n for t, n in self.df.items() if n > max_df * self.leaves})


def test_the_cache_reads_once_per_set_of_kbs_and_generations() -> None:
    lookup = CountingLookup(df={"the": 400, "warranty": 3})
    cache = FrequentTermsCache(lookup, 0.5)
    gens = {"b": "e#1", "a": "e#4"}
    assert cache.get(gens) == TermFrequencies(500, {"the": 400})
    assert cache.get({"a": "e#4", "b": "e#1"}) == TermFrequencies(500, {"the": 400})
    assert lookup.calls == [(("a", "b"), 0.5)]
    lookup.df["the"], lookup.leaves = 10, 900
    assert cache.get({"a": "e#5", "b": "e#1"}) == TermFrequencies(900, {})  # a new generation: read again
    assert cache.get({"a": "e#5"}, timeout_s=1.0) == TermFrequencies(900, {})  # another set of kbs
    assert len(lookup.calls) == 3


def test_the_cache_is_bounded_and_a_failed_lookup_is_not_remembered() -> None:
    lookup = CountingLookup()
    cache = FrequentTermsCache(lookup, 0.5, max_kb_sets=2)
    for kb in ("a", "b", "c"):
        cache.get({kb: "e#1"})
    cache.get({"a": "e#1"})  # evicted by "c": read again
    assert len(lookup.calls) == 4
    lookup.fail = True
    with pytest.raises(RuntimeError):
        cache.get({"z": "e#1"})
    lookup.fail = False
    assert cache.get({"z": "e#1"}).leaves == 500 and len(lookup.calls) == 6


def test_the_cache_answers_concurrent_queries_consistently() -> None:
    lookup = CountingLookup(df={"common": 400})
    cache = FrequentTermsCache(lookup, 0.5)
    wrong: list[object] = []

    def ask(offset: int) -> None:
        for i in range(200):
            got = cache.get({"kb": f"e#{(offset + i) % 3}"})
            if got != TermFrequencies(500, {"common": 400}):
                wrong.append(got)

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
