"""A document's term statistics, counted on a parse worker instead of the indexer's own process.

Counting the BM25 analyzer's terms of every leaf (``term_stats.count_terms``: jieba, in Python) was a fifth of
what the indexer's process did with a free encoder, and that process holds one interpreter lock for its writes,
its chunking and this. A parse worker is a process of its own, warm, already bounded in time and memory and
killed on a crash (``loaders._isolated``): the indexer's read-ahead thread hands it a document's leaf texts and
waits on its pipe, which lets go of the lock, while the writer goes on.

The worker's tokens are the ones Milvus indexes: the analyzer ``term_tokenizer`` gives (a picklable partial of
``analyzer.jieba_tokens`` or ``analyzer._standard``), and for jieba the kb's collection's user dictionary
(``LeafIndex.dictionary_for``: its modules and skill points) added to the worker's jieba as Milvus Lite adds it
to its own when it opens the collection (``jieba.add_word``; jieba's dictionary is process-wide there too). A
worker keeps the words it was given, as a Milvus Lite process keeps those of every collection it opened.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Collection, Sequence

from strata.indexing.loaders._isolated import run_isolated
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.loaders._worker import keep_resident
from strata.stores import analyzer
from strata.stores.analyzer import Tokenize
from strata.stores.term_stats import count_terms

_ADDED: set[str] = set()  # the user dictionary words this worker's jieba holds


class WorkerTermCounter:
    """Counts documents' leaf texts' terms on a parse worker, many documents a call:
    ``counter([texts of doc 1, texts of doc 2, ...]) -> [{term: leaves of doc 1 holding it}, ...]``."""

    def __init__(
        self,
        tokenize: Tokenize,
        dictionary: Collection[str],
        limits: LoaderLimits,
        stop: threading.Event | None = None,
    ) -> None:
        self._tokenize = tokenize
        self._words = tuple(sorted(dictionary))
        self._limits = limits
        self._stop = stop

    def __call__(self, documents: Sequence[Sequence[str]]) -> list[dict[str, int]]:
        if not any(documents):
            return [{} for _ in documents]
        texts = [list(doc) for doc in documents]
        payload = pickle.dumps((self._tokenize, self._words, texts), protocol=pickle.HIGHEST_PROTOCOL)
        counts: list[dict[str, int]] = run_isolated(count_job, payload, self._limits, self._stop)
        return counts


def count_job(raw: bytes, limits: LoaderLimits) -> list[dict[str, int]]:
    """The worker's side: ``count_terms`` of each document's texts, after the dictionary's new words are added
    to jieba."""
    tokenize, words, documents = pickle.loads(raw)
    if _is_jieba(tokenize):
        _jieba_ready()
    new = [word for word in words if word not in _ADDED]
    if new:
        import jieba

        for word in new:
            jieba.add_word(word)
        _ADDED.update(new)
    return [count_terms(texts, tokenize) for texts in documents]


def _is_jieba(tokenize: Tokenize) -> bool:
    return getattr(tokenize, "func", None) is analyzer.jieba_tokens


def _jieba_ready() -> None:
    """jieba's dictionary, loaded once per worker (about a second, tens of megabytes) and kept: the worker is
    not retired for holding it (``_worker.keep_resident``)."""
    import jieba

    if not jieba.dt.initialized:
        jieba.setLogLevel(logging.WARNING)  # not its "Building prefix dict" lines on the worker's stderr
        jieba.initialize()
        keep_resident()
