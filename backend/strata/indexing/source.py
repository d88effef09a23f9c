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

from strata.config import ChunkingSettings
from strata.errors import LoaderError
from strata.indexing.chunking import iter_chunks
from strata.indexing.embedding import search_text
from strata.indexing.plan import DocumentPlan, Scan, index_hash
from strata.indexing.report import IndexReport
from strata.indexing.scan import read_again
from strata.stores.analyzer import Tokenize
from strata.stores.leaf_schema import leaf_limit_violation
from strata.stores.term_stats import add_terms
from strata.types import Chunk, DocumentVersion, SourceDocument

logger = logging.getLogger(__name__)


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
        tokenize: Tokenize | None,
    ) -> None:
        self._kb_id = kb_id
        self._settings = settings
        self._group_leaves = group_leaves
        self._load = load
        self._tokenize = tokenize

    def prepared(self, scan: Scan, items: Iterable[DocumentPlan], report: IndexReport) -> Iterator[PreparedDocument]:
        """``items`` prepared one at a time, as the writer asks for them; those that cannot be indexed are reported
        and skipped (the run goes on)."""
        for item in items:
            doc = self.prepare(scan, item, report)
            if doc is not None:
                yield doc

    def prepare(self, scan: Scan, item: DocumentPlan, report: IndexReport) -> PreparedDocument | None:
        """Chunks the document once to check and count it (None when it cannot be indexed: reported). Its chunks
        are kept only while it has at most ``group_leaves`` leaves."""
        whole = _whole(scan, item, report, self._load)
        if whole is None:
            return None
        try:
            return self._counted(whole, report)
        except Exception as exc:  # a chunker or tokenizer bug on one file must not stop the batch
            logger.exception("chunking %s failed", item.doc.source)
            report.file_failed(item.doc.source, f"chunking or counting its terms failed: {exc}")
            return None

    def _counted(self, item: DocumentPlan, report: IndexReport) -> PreparedDocument | None:
        held: list[Chunk] | None = []
        leaves = count = 0
        terms: Counter[str] = Counter()
        for chunk in self._chunks(item):
            count += 1
            if chunk.is_leaf:
                leaves += 1
                text = search_text(chunk, self._settings.contextualize)
                problem = leaf_limit_violation(chunk, text)
                if problem:
                    report.file_failed(item.doc.source, f"cannot be indexed: {problem}")
                    return None
                if self._tokenize is not None:
                    add_terms(terms, text, self._tokenize)
            if held is not None:
                held.append(chunk)
                held = held if leaves <= self._group_leaves else None  # too large to hold: chunked again
        ordered = None if held is None else sorted(held, key=lambda c: c.level)  # L1s, L2s, L3s
        return PreparedDocument(item, ordered, leaves, count, None if self._tokenize is None else dict(terms))

    def batches(self, group: Sequence[PreparedDocument]) -> Iterator[list[Chunk]]:
        """The group's chunks, held or chunked again, in consecutive batches of at most ``group_leaves`` leaves
        (and three times as many chunks)."""
        chunks = chain.from_iterable(doc.held if doc.held is not None else self._chunks(doc.item) for doc in group)
        return _batches(chunks, self._group_leaves)

    def _chunks(self, item: DocumentPlan) -> Iterator[Chunk]:
        return iter_chunks(item.doc, kb_id=self._kb_id, version=item.version, settings=self._settings)


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
    scan: Scan, item: DocumentPlan, report: IndexReport, load: Callable[..., SourceDocument]
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
