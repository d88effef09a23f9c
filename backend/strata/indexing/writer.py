"""The one write loop: every document, whatever its size, written a batch at a time, then served.

Groups are prepared (read again if the scan let their text go, chunked, checked, their terms counted) on a
thread of their own one group ahead of the writer (``ahead``): while the writer waits on its stores or its
encoder, the next group is made ready, and at most two groups' chunks are held besides the one written. Their
failures are reported on the writer's thread, before the group they preceded is written.

A group of documents (``source.groups``) is written as: each version's ``pending`` row with its counts;
then, batch by batch (``ChunkSource.batches``: at most ``group_leaves`` leaves, held chunks or chunked
again), the batch's chunks into SQL (``sql_pending``), its leaves embedded and upserted into Milvus and its
parents into the cache; then one flush (``milvus_upsert``, ``milvus_flush``) and each version's leaf count
checked in Milvus. ``write`` yields each group's outcome; the run then serves it (``serve``: one
``activate``) or, for ``--recreate``, gathers every group's and serves them all in one switch at the end.

Parents are cached as their batch is written, before their version serves: their ids are the pending
version's own and SQL holds them, so a version that never serves has them invalidated with its rows
(``Removal.remove_versions``), and a version that serves finds them there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from strata.indexing.ahead import ahead
from strata.indexing.embedding import upsert_leaves
from strata.indexing.plan import DocumentPlan, Scan, WriteOutcome
from strata.indexing.run import IndexRun, WriteStep
from strata.indexing.source import ChunkSource, Failures, PreparedDocument, groups
from strata.resources import Resources
from strata.types import Chunk, DocumentVersion


@dataclass(frozen=True)
class WrittenVersion:
    """A version written and verified, still pending: its row's fields and counts, none of its chunks or text
    (``--recreate`` keeps one per document until its switch)."""

    row: DocumentVersion
    chunk_count: int
    outcome: WriteOutcome  # the report's count: ``DocumentPlan.outcome``


@dataclass(frozen=True)
class WrittenGroup:
    """What writing one group did: the versions verified, and every document it wrote (verified or not: the
    versions of these that do not serve are removed once the verified ones serve)."""

    verified: tuple[WrittenVersion, ...]
    doc_ids: frozenset[str]


class VersionWriter:
    """Writes a run's documents as pending versions, group by group, and serves written versions."""

    def __init__(
        self, resources: Resources, run: IndexRun, source: ChunkSource, *, group_leaves: int, signature: str
    ) -> None:
        self._res = resources
        self._run = run
        self._source = source
        self._group_leaves = group_leaves
        self._signature = signature

    def write(self, scan: Scan, items: Iterable[DocumentPlan]) -> Iterator[WrittenGroup]:
        """Each group of ``items`` prepared (one group ahead, on a thread of its own), written and checked, as
        the caller asks for the next: a group's chunks are let go once it is written, so a run holds at most
        three groups' (the one written, one ready, one being prepared)."""
        failures = Failures()
        prepared = _with_failures(groups(self._source.prepared(scan, items, failures), self._group_leaves), failures)
        with ahead(prepared, depth=1, name=f"strata-prepare-{self._run.kb_id}") as ready:
            for group, failed in ready:
                for source, reason in failed:
                    self._run.report.file_failed(source, reason)
                if group:
                    yield self._write_group(group)

    def serve(self, versions: Sequence[WrittenVersion], *, retire: Sequence[str] = ()) -> None:
        """In one SQL transaction ``versions`` serve (their documents' other versions are retired) and the
        documents in ``retire`` stop serving (``--recreate``'s switch); the kb records the encoder they were
        encoded with (the one it had, but after a ``--recreate`` with another). Then the report counts them."""
        documents, encoder = self._res.documents, self._res.encoder
        documents.versions.switch(self._run.kb_id, [(v.row.doc_id, v.row.version) for v in versions], retire=retire)
        documents.kbs.set_encoder(self._run.kb_id, encoder=encoder.name, dim=encoder.dim)
        self._run.checkpoint(WriteStep.ACTIVATE)
        for version in versions:
            self._served(version)

    def _write_group(self, group: list[PreparedDocument]) -> WrittenGroup:
        resume = any(doc.item.resumes for doc in group)
        self._res.documents.versions.write_pending_many(
            [
                (doc.version_row(self._run.kb_id, self._signature), doc.term_counts, doc.chunk_count)
                for doc in group
                if not doc.item.resumes  # a resumed version keeps its row and the chunks it has
            ]
        )
        tally = _LeafTally(group)
        for batch in self._source.batches(group):
            self._write_batch(batch, tally, resume=resume)
        self._run.checkpoint(WriteStep.MILVUS_UPSERT)
        self._res.leaf_index.flush()
        self._run.checkpoint(WriteStep.MILVUS_FLUSH)
        found = self._res.leaf_index.count_versions(
            self._run.kb_id, [(doc.item.doc.doc_id, doc.item.version) for doc in group]
        )
        verified = tuple(self._written(doc) for doc in group if self._verified(doc, found))
        return WrittenGroup(verified, frozenset(doc.item.doc.doc_id for doc in group))

    def _write_batch(self, batch: list[Chunk], tally: _LeafTally, *, resume: bool) -> None:
        """One batch into SQL, Milvus and the cache, with progress after it; ``resume``: what a stopped run
        wrote of a resumed version is kept, not written again."""
        self._res.documents.versions.add_chunks(batch, skip_existing=resume)
        self._run.checkpoint(WriteStep.SQL_PENDING)
        cache = self._res.cached_chunks
        shared = not cache.in_process  # a process's own cache is filled by its queries, not by its writes
        self._run.writes.writing(batch, cached=shared)
        leaves = [c for c in batch if c.is_leaf]
        if leaves:
            self._upsert(leaves, resume=resume)
        if shared:
            cache.put_many([c for c in batch if not c.is_leaf])
        tally.written(leaves, self._run)

    def _upsert(self, leaves: list[Chunk], *, resume: bool) -> None:
        """Embeds (the embedding cache, then the encoder) and upserts ``leaves``."""
        run = self._run
        embedded = upsert_leaves(
            self._res,
            self._res.leaf_index,
            run.kb_id,
            leaves,
            progress=run.progress,
            batch_cached=lambda: run.checkpoint(WriteStep.ENCODER_BATCH),
            keep_present=resume,
        )
        run.report.leaves_embedded(
            encoded=embedded.encoded, reused=embedded.reused, kept=embedded.kept, seconds=embedded.seconds
        )

    def _verified(self, doc: PreparedDocument, counted: Mapping[tuple[str, int], int]) -> bool:
        """Whether Milvus (``counted``: the group's counts, read after its flush) holds every leaf of the
        version; else it is reported failed."""
        item = doc.item
        found = counted[(item.doc.doc_id, item.version)]
        if found != doc.leaf_count:
            message = f"Milvus holds {found} leaves, expected {doc.leaf_count}; version not activated"
            self._run.report.file_failed(item.doc.source, message)
        return found == doc.leaf_count

    def _written(self, doc: PreparedDocument) -> WrittenVersion:
        row = doc.version_row(self._run.kb_id, self._signature)
        return WrittenVersion(row, doc.chunk_count, doc.item.outcome)

    def _served(self, version: WrittenVersion) -> None:
        self._run.report.document_written(version.outcome, chunks=version.chunk_count, leaves=version.row.leaf_count)
        self._run.progress.file_done(version.row.source, version.outcome, version.chunk_count)


def _with_failures(
    prepared: Iterable[list[PreparedDocument]], failures: Failures
) -> Iterator[tuple[list[PreparedDocument], list[tuple[str, str]]]]:
    """Each group with the failures met while it was prepared; then the failures after the last group."""
    for group in prepared:
        yield group, failures.take()
    yield [], failures.take()


class _LeafTally:
    """The leaves of each document of a group written so far, for progress after every batch."""

    def __init__(self, group: Sequence[PreparedDocument]) -> None:
        self._docs = {doc.item.doc.doc_id: (doc.item.doc.source, doc.leaf_count) for doc in group}
        self._written: Counter[str] = Counter()

    def written(self, leaves: Sequence[Chunk], run: IndexRun) -> None:
        for doc_id, count in Counter(leaf.doc_id for leaf in leaves).items():
            self._written[doc_id] += count
            source, total = self._docs[doc_id]
            run.progress.leaves_written(source, self._written[doc_id], total)
