"""Term statistics counted on a parse worker (strata.indexing.term_counting) are the ones counted here, with the
kb's dictionary words, and the worker that loaded jieba stays for the next document."""

from __future__ import annotations

import functools
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from strata.errors import IndexingStoppedError, LoaderError
from strata.indexing.loaders._isolated import POOL
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.term_counting import WorkerTermCounter
from strata.stores.analyzer import analyzer_tokenizer
from strata.stores.term_stats import count_terms
from tests.support import parse_probes
from tests.support.processes import wait_for

# No word other tests put in a kb's dictionary (a worker keeps the words it was given, as Milvus Lite does)
# but the dictionary word of these tests, 两步验证
TEXTS = [
    "开启两步验证后，每次转账需要手机上的动态口令。",
    "The orchard keeper records frost, rain and pruning dates.",
    "账单导出 的 两步验证 与 CSV 格式",
    "",
]


def _pristine_jieba(words: frozenset[str]) -> Callable[[str], list[str]]:
    """``analyzer.jieba_tokens`` on a jieba of its own: the process-wide one holds the words other tests (and
    Milvus Lite collections opened in this process) added to it."""
    import jieba

    tokenizer = jieba.Tokenizer()
    for word in sorted(words):
        tokenizer.add_word(word)
    return lambda text: [t.strip().lower() for t in tokenizer.cut_for_search(text) if t.strip()]


@pytest.mark.parametrize("analyzer", [{"tokenizer": "jieba"}, {"tokenizer": "standard"}])
def test_the_worker_counts_what_the_analyzer_counts(analyzer: dict) -> None:
    tokenize = analyzer_tokenizer(analyzer)
    words = frozenset({"两步验证"})
    expected_tokens = _pristine_jieba(words) if analyzer["tokenizer"] == "jieba" else tokenize
    counter = WorkerTermCounter(tokenize, words, LoaderLimits())
    documents = [TEXTS, TEXTS[:1], [], TEXTS[1:]]
    assert counter(documents) == [count_terms(texts, expected_tokens) for texts in documents]
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


def _hanging_counter(started: Path, limits: LoaderLimits) -> WorkerTermCounter:
    return WorkerTermCounter(functools.partial(parse_probes.announce_and_hang_tokens, str(started)), (), limits)


def _counted_on_another_worker(hung: int) -> None:
    """The next count runs, on a worker that is not the one that hung or died."""
    tokenize = analyzer_tokenizer({"tokenizer": "standard"})
    assert WorkerTermCounter(tokenize, (), LoaderLimits())([TEXTS[1:2]]) == [count_terms(TEXTS[1:2], tokenize)]
    with POOL._lock:
        assert hung not in {w.pid for w in POOL._idle}


def test_a_worker_killed_mid_count_fails_that_count_and_the_next_count_runs(tmp_path: Path) -> None:
    """The indexer retries a failed count a document at a time (``ChunkSource``), so a kill fails at most the
    document it recurs on."""
    started = tmp_path / "started"
    with ThreadPoolExecutor(1) as executor:
        counting = executor.submit(_hanging_counter(started, LoaderLimits(parse_timeout_s=120)), [TEXTS])
        assert wait_for(started.exists, within_s=120), "the count never started on a worker"
        pid = int(started.read_text())
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(LoaderError, match=r"^the parser process died \(killed by SIGKILL\) before it answered$"):
            counting.result(timeout=120)
    _counted_on_another_worker(pid)


def test_a_count_past_the_parse_timeout_is_stopped_and_the_next_count_runs(tmp_path: Path) -> None:
    started = tmp_path / "started"
    with pytest.raises(LoaderError, match=r"^parsing took longer than STRATA_INDEXING__PARSE_TIMEOUT_S \(1 s\)"):
        _hanging_counter(started, LoaderLimits(parse_timeout_s=1))([TEXTS])
    _counted_on_another_worker(int(started.read_text()))
