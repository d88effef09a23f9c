"""Term statistics counted on a parse worker (strata.indexing.term_counting) are the ones counted here, with the
kb's dictionary words, and the worker that loaded jieba stays for the next document."""

from __future__ import annotations

import threading

import pytest

from strata.errors import IndexingStoppedError
from strata.indexing.loaders._isolated import POOL
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.term_counting import WorkerTermCounter
from strata.stores.analyzer import analyzer_tokenizer
from strata.stores.term_stats import count_terms

TEXTS = [
    "开启两步验证后，登录需要手机上的动态口令。",
    "The lighthouse keeper logs weather, tides and harbour notes.",
    "auth-service 的 两步验证 与 SSO 单点登录",
    "",
]


@pytest.mark.parametrize("analyzer", [{"tokenizer": "jieba"}, {"tokenizer": "standard"}])
def test_the_worker_counts_what_this_process_counts(analyzer: dict) -> None:
    tokenize = analyzer_tokenizer(analyzer)
    counter = WorkerTermCounter(tokenize, frozenset(), LoaderLimits())
    documents = [TEXTS, TEXTS[:1], [], TEXTS[1:]]
    assert counter(documents) == [count_terms(texts, tokenize) for texts in documents]
    assert counter([[], []]) == [{}, {}]


def test_the_kbs_dictionary_words_are_terms_of_their_own_on_the_worker() -> None:
    tokenize = analyzer_tokenizer({"tokenizer": "jieba"})
    word = "双因素口令验"  # not a jieba word: without the dictionary it is cut into pieces
    text = f"如何开启{word}功能"
    assert word not in WorkerTermCounter(tokenize, frozenset(), LoaderLimits())([[text]])[0]
    assert word in WorkerTermCounter(tokenize, frozenset({word}), LoaderLimits())([[text]])[0]


def test_the_worker_keeps_jieba_and_serves_the_next_document() -> None:
    """Loading jieba's dictionary grows a worker past the growth that retires it; it is kept on purpose."""
    counter = WorkerTermCounter(analyzer_tokenizer({"tokenizer": "jieba"}), frozenset(), LoaderLimits())
    counter([TEXTS])
    with POOL._lock:
        before = sorted(w.pid for w in POOL._idle)
    for _ in range(3):
        counter([TEXTS])
    with POOL._lock:
        after = sorted(w.pid for w in POOL._idle)
    assert before and after == before


def test_a_stopped_run_stops_its_count() -> None:
    stop = threading.Event()
    stop.set()
    counter = WorkerTermCounter(analyzer_tokenizer({"tokenizer": "jieba"}), frozenset(), LoaderLimits(), stop)
    with pytest.raises(IndexingStoppedError):
        counter([TEXTS])
