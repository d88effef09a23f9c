"""The chunk source of a run: documents checked and counted, then their chunks in batches, whatever their size.

A document is chunked once before anything of it is written, to check its leaves against the
collection's limits and count its leaves, chunks and terms (``ChunkSource.prepare``). A document of at
most ``group_leaves`` leaves keeps those chunks (it is *held*); a larger one keeps only its counts and is
chunked again as it is written (``chunking.iter_chunks``: one L1 with its L2s and L3s at a time), so a
document of 200,000 leaves holds its text and one batch, not its chunks. Either way the writer sees the
same thing: groups of documents (``groups``) and each group's chunks in batches of at most
``group_leaves`` leaves (``ChunkSource.batches``), parents before their children.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from typing import Protocol

from strata.config import ChunkingSettings
from strata.errors import IndexingStoppedError, LoaderError
from strata.indexing.chunking import iter_chunks
from strata.indexing.embedding import search_text
from strata.indexing.plan import DocumentPlan, Scan, index_hash
from strata.indexing.scan import read_again
from strata.stores.leaf_schema import leaf_limit_violation
from strata.types import Chunk, DocumentVersion, SourceDocument

logger = logging.getLogger(__name__)

COUNT_BATCH = 2000  # leaf texts counted at a time: counts of disjoint leaves add up


class FailureSink(Protocol):
    """Where a document that cannot be indexed is reported: the run's ``IndexReport``, or ``Failures``."""

    def file_failed(self, source: str, reason: str) -> None: ...


class Failures:
    """The failures of documents prepared on the read-ahead thread, held until the writer's thread reports
    them (``take``), so that the run's report is changed on one thread only."""

    def __init__(self) -> None:
        self._failed: list[tuple[str, str]] = []

    def file_failed(self, source: str, reason: str) -> None:
        self._failed.append((source, reason))

    def take(self) -> list[tuple[str, str]]:
        """The failures recorded since the last take."""
        taken, self._failed = self._failed, []
        return taken


CountTerms = Callable[[Sequence[Sequence[str]]], list[dict[str, int]]]
"""Several documents' leaf texts -> for each, {term: leaves holding it}."""


@dataclass(frozen=True)
class PreparedDocument:
    """A document checked, counted and ready to write: ``held`` is its chunks (L1s, L2s, L3s) when it has
    at most ``group_leaves`` leaves, else None (too large to hold: chunked again, a batch at a time)."""

    item: DocumentPlan
    held: list[Chunk] | None
    leaf_count: int
    chunk_count: int
    term_counts: dict[str, int] | None  # None: the analyzer's terms are not counted

    def version_row(self, kb_id: str, signature: str) -> DocumentVersion:
        """The version's SQL row as written ``pending``."""
        doc = self.item.doc
        return DocumentVersion(
            kb_id=kb_id,
            doc_id=doc.doc_id,
            version=self.item.version,
            source=doc.source,
            content_hash=index_hash(doc.content_hash, signature),
            leaf_count=self.leaf_count,
            metadata=dict(doc.metadata),
            root=self.item.root,
        )


class ChunkSource:
    """Chunks a run's documents for one kb: once to prepare them, then in batches to write them."""

    def __init__(
        self,
        kb_id: str,
        settings: ChunkingSettings,
        *,
        group_leaves: int,
        load: Callable[..., SourceDocument],
        count_terms: CountTerms | None,
    ) -> None:
        """``count_terms``: several documents' leaf texts -> for each, {term: leaves holding it}
        (``term_stats.count_terms`` with the analyzer's tokenizer per document, or
        ``term_counting.WorkerTermCounter``, one call for many documents); None: terms are not counted."""
        self._kb_id = kb_id
        self._settings = settings
        self._group_leaves = group_leaves
        self._load = load
        self._count_terms = count_terms

    def prepared(self, scan: Scan, items: Iterable[DocumentPlan], report: FailureSink) -> Iterator[PreparedDocument]:
        """``items`` prepared, in order, as the writer asks for them; those that cannot be indexed are reported
        and skipped (the run goes on). Documents are chunked one at a time and their terms counted together,
        a group's worth of leaves at a time (at most ``COUNT_BATCH``; one call of ``count_terms`` for many
        small documents), so no more than a group's chunks wait to be counted."""
        waiting: list[_Chunked] = []
        leaves = 0
        for item in items:
            doc = self._chunked(scan, item, report)
            if doc is None:
                continue
            waiting.append(doc)
            leaves += len(doc.texts)
            if leaves >= min(COUNT_BATCH, self._group_leaves) or self._count_terms is None:
                yield from self._counted(waiting, report)
                waiting, leaves = [], 0
        yield from self._counted(waiting, report)

    def _chunked(self, scan: Scan, item: DocumentPlan, report: FailureSink) -> _Chunked | None:
        """Chunks the document once to check and count it (None when it cannot be indexed: reported). Its chunks
        are kept only while it has at most ``group_leaves`` leaves; its leaf texts until its terms are counted,
        a larger document's ``COUNT_BATCH`` at a time."""
        whole = _whole(scan, item, report, self._load)
        if whole is None:
            return None
        try:
            return self._chunk(whole, report)
        except IndexingStoppedError:  # the run stops (a term count on a parse worker saw the stop): not this file
            raise
        except Exception as exc:  # a chunker or tokenizer bug, a count that ran out of time: this file fails
            logger.exception("chunking %s failed", item.doc.source)
            report.file_failed(item.doc.source, f"chunking or counting its terms failed: {exc}")
            return None

    def _chunk(self, item: DocumentPlan, report: FailureSink) -> _Chunked | None:
        doc = _Chunked(item)
        held: list[Chunk] | None = []
        for chunk in self._chunks(item):
            doc.chunks += 1
            if chunk.is_leaf:
                doc.leaves += 1
                text = search_text(chunk, self._settings.contextualize)
                problem = leaf_limit_violation(chunk, text)
                if problem:
                    report.file_failed(item.doc.source, f"cannot be indexed: {problem}")
                    return None
                if self._count_terms is not None:
                    doc.texts.append(text)
                    if len(doc.texts) >= COUNT_BATCH:  # a large document: counted as it is chunked
                        (counts,) = self._count_terms([doc.texts])
                        doc.terms.update(counts)
                        doc.texts = []
            if held is not None:
                held.append(chunk)
                held = held if doc.leaves <= self._group_leaves else None  # too large to hold: chunked again
        doc.held = None if held is None else sorted(held, key=lambda c: c.level)  # L1s, L2s, L3s
        return doc

    def _counted(self, docs: list[_Chunked], report: FailureSink) -> Iterator[PreparedDocument]:
        """``docs`` with their terms counted in one call; if that call fails, a call per document, so that
        only the document it fails on fails."""
        if self._count_terms is None:
            yield from (doc.prepared(None) for doc in docs)
            return
        if not docs:
            return
        failure = ""
        try:
            counted = self._count_terms([doc.texts for doc in docs])
        except IndexingStoppedError:
            raise
        except Exception as exc:  # a count that ran out of time or memory, a tokenizer bug
            failure = f"counting its terms failed: {exc}"
            logger.warning("counting the terms of %d document(s) failed: %s", len(docs), exc)
        if failure and len(docs) > 1:  # a call per document: only the one it fails on fails
            for doc in docs:
                yield from self._counted([doc], report)
            return
        if failure:
            report.file_failed(docs[0].item.doc.source, failure)
            return
        for doc, counts in zip(docs, counted, strict=True):
            doc.terms.update(counts)
            yield doc.prepared(dict(doc.terms))

    def batches(self, group: Sequence[PreparedDocument]) -> Iterator[list[Chunk]]:
        """The group's chunks, held or chunked again, in consecutive batches of at most ``group_leaves`` leaves
        (and three times as many chunks)."""
        chunks = chain.from_iterable(doc.held if doc.held is not None else self._chunks(doc.item) for doc in group)
        return _batches(chunks, self._group_leaves)

    def _chunks(self, item: DocumentPlan) -> Iterator[Chunk]:
        return iter_chunks(item.doc, kb_id=self._kb_id, version=item.version, settings=self._settings)


class _Chunked:
    """A document chunked once and checked, its terms not yet (all) counted."""

    def __init__(self, item: DocumentPlan) -> None:
        self.item = item
        self.held: list[Chunk] | None = None
        self.leaves = 0
        self.chunks = 0
        self.texts: list[str] = []  # leaf texts not counted yet
        self.terms: Counter[str] = Counter()  # the counts of the texts counted already

    def prepared(self, terms: dict[str, int] | None) -> PreparedDocument:
        return PreparedDocument(self.item, self.held, self.leaves, self.chunks, terms)


def groups(docs: Iterable[PreparedDocument], max_leaves: int) -> Iterator[list[PreparedDocument]]:
    """Consecutive documents, a group closed once it has ``max_leaves`` leaves: Milvus gets few, large segments
    (its BM25 statistics are per segment) and one flush per group. A document of more leaves is a group of its
    own, so no held document waits while it is chunked again."""
    group: list[PreparedDocument] = []
    leaves = 0
    for doc in docs:
        if doc.leaf_count > max_leaves and group:
            yield group
            group, leaves = [], 0
        group.append(doc)
        leaves += doc.leaf_count
        if leaves >= max_leaves:
            yield group
            group, leaves = [], 0
    if group:
        yield group


def _whole(
    scan: Scan, item: DocumentPlan, report: FailureSink, load: Callable[..., SourceDocument]
) -> DocumentPlan | None:
    """``item`` with its document whole (read again when the scan let its text go); None when it cannot be
    (reported; its indexed version is kept). Its size was checked as it was loaded (``LoaderLimits``)."""
    try:
        return replace(item, doc=read_again(scan, item.doc, load))
    except LoaderError as exc:
        report.file_failed(item.doc.source, f"{exc} (its indexed version, if any, is kept)")
        return None


def _batches(chunks: Iterable[Chunk], max_leaves: int) -> Iterator[list[Chunk]]:
    """Consecutive chunks with at most ``max_leaves`` leaves (and three times as many chunks) each."""
    batch: list[Chunk] = []
    leaves = 0
    for chunk in chunks:
        batch.append(chunk)
        leaves += chunk.is_leaf
        if leaves >= max_leaves or len(batch) >= 3 * max_leaves:
            yield batch
            batch, leaves = [], 0
    if batch:
        yield batch
