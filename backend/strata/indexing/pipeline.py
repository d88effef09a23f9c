"""The indexing pipeline: load → chunk → encode L3 → write, incrementally.

Write order makes partial work invisible and reruns safe (ids are
deterministic, so a rerun overwrites instead of duplicating):

1. SQL: the new document version as ``pending`` with all its chunks;
2. Milvus: its leaves (``upsert``), then ``flush``;
3. verify the leaf count in Milvus equals the L3 count;
4. SQL: mark the version ``active`` (older versions become ``retired``);
5. remove retired versions from Milvus, the parent cache and SQL.

Retrieval hides every version that is not ``active``, so a crash at any step
leaves the previous version serving; the next run first cleans what a crash
left behind (``reconcile``). Documents are written in groups so Milvus gets
few, large segments (its BM25 statistics are per segment) and one flush per
group. A document of more than ``group_leaves`` leaves is chunked once to be
checked and counted, then written on its own as it is chunked again: its
pending row, then its chunks, leaves and parents a batch at a time, with
progress after each; so a document of 200,000 leaves holds its text and one
batch, not its chunks. A document over ``STRATA_INDEXING__MAX_DOCUMENT_BYTES``
fails on its own, in the loader (``LoaderLimits``): before its text reaches the
run, and a .txt or .md file over twice the limit before it is read.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Callable, Collection, Iterable, Iterator, Mapping, Sequence

from strata.config import ChunkingSettings
from strata.errors import DeleteRefusedError, LeavesMissingError, LoaderError, StoreError
from strata.indexing.chunking import iter_chunks
from strata.indexing.consistency import check_leaves
from strata.indexing.embedding import search_text, upsert_leaves
from strata.indexing.loaders import LoaderLimits, load_document
from strata.indexing.plan import DeleteLimit, DocumentPlan, IndexPlan, Scan, index_hash, plan_changes, refuse_deletions
from strata.indexing.reconcile import ReconcileReport, check_stores, repair_stores, retry_invalidations
from strata.indexing.report import IndexReport, NoProgress, Progress, record_failure
from strata.indexing.scan import HOLD_CHARS, read_again, scan_paths, without_text, without_root_conflicts
from strata.indexing.terms import backfill_term_stats, term_tokenizer
from strata.resources import Resources
from strata.stores.catalog import Catalog
from strata.stores.lease import KbLease
from strata.stores.leaf_schema import LIMITS, dictionary_terms, leaf_limit_violation
from strata.stores.leaf_index import LeafIndex
from strata.stores.term_stats import add_terms
from strata.types import ACTIVE, Chunk, DocumentVersion, SourceDocument

logger = logging.getLogger(__name__)

WRITE_STEPS = ("sql_pending", "milvus_upsert", "milvus_flush", "activate", "retire_milvus", "retire_sql")
ENCODER_BATCH = "encoder_batch"  # a step passed after each encoder batch is cached
START_PROBES = 1000  # served versions a run's start probes in Milvus by id (`strata stats` probes every one)


def chunking_signature(settings: ChunkingSettings) -> str:
    """Changes whenever chunk boundaries or search texts would change."""
    return hashlib.sha1(settings.model_dump_json().encode()).hexdigest()[:16]


class Indexer:
    """Indexes folders into one knowledge base, incrementally, holding the kb's lease while it writes."""

    def __init__(
        self, resources: Resources, *, group_leaves: int = 2000, lease_ttl_s: float | None = None, kb_only_notes: bool = False,
        after_write_step: Callable[[str], None] | None = None, hold_chars: int = HOLD_CHARS,
    ) -> None:
        """``kb_only_notes``: the report names nothing learned from other kbs (the service, whose keys may be
        scoped to some kbs); without it the notes may name what the collection's BM25 dictionary lacks.
        ``hold_chars``: the documents' text a run holds from its scan to its writes (``scan_paths``).
        ``after_write_step`` is called with the name of each step (``WRITE_STEPS``, ``ENCODER_BATCH``) right
        after it: the crash tests' seam (tests/kill_at_launcher.py kills the process there)."""
        self._res = resources
        self._kb_only_notes = kb_only_notes
        self._chunking = resources.settings.chunking
        self._signature = chunking_signature(self._chunking)
        self._group_leaves = group_leaves  # also the leaves looked up, encoded and upserted at a time
        self._stopping = threading.Event()
        limits = LoaderLimits.from_settings(resources.settings.indexing)
        self._load = functools.partial(load_document, limits=limits, stop=self._stopping)
        self._lease_ttl_s = lease_ttl_s if lease_ttl_s is not None else resources.settings.indexing.lease_ttl_s
        self._hold_chars = hold_chars
        self._leases: dict[str, KbLease] = {}
        self._after_write_step = after_write_step
        self._tokenize, why_not = term_tokenizer(resources)  # None: the analyzer's terms cannot be counted here
        if why_not:
            logger.info(why_not)

    def stop(self) -> None:
        """Stops the runs in progress at their next file (a parse in progress is killed) and refuses new ones:
        they raise ``IndexingStoppedError``, releasing their leases. For a service shutting down."""
        self._stopping.set()

    def lease(self, kb_id: str) -> KbLease:
        """The kb's indexing lease (re-entrant): a second writer of the kb fails at once, naming the holder."""
        if kb_id not in self._leases:
            self._leases[kb_id] = KbLease(self._res.documents, kb_id, ttl_s=self._lease_ttl_s)
        return self._leases[kb_id]

    # -- the batch job ----------------------------------------------------------

    def index_paths(
        self,
        paths: Sequence[Path],
        *,
        kb_id: str,
        delete_missing: bool = False,
        recreate: bool = False,
        dry_run: bool = False,
        progress: Progress | None = None,
        root_names: Mapping[Path, str] | None = None,
        keep: Collection[str] = (),
        max_delete: int | None = None,
        force_delete: bool = False,
    ) -> IndexReport:
        """Brings ``kb_id`` in line with the files under ``paths``.

        ``delete_missing`` deletes documents that vanished from a folder argument that was
        read whole, unless that would pass a ``DeleteLimit`` (``max_delete``, default
        ``STRATA_INDEXING__MAX_DELETE``; ``force_delete`` lifts it): then the run raises
        ``DeleteRefusedError`` before it writes any document. ``recreate`` rebuilds every
        document as a new version and switches to them all at once at the end, or, if anything failed, keeps the old kb serving.
        ``root_names`` and ``keep`` are for uploads (see ``scan_paths``).
        """
        _check_kb_id(kb_id)
        progress = progress or NoProgress()
        started = time.perf_counter()
        report = IndexReport(kb=kb_id, dry_run=dry_run)
        limit = DeleteLimit(self._res.settings.indexing.max_delete if max_delete is None else max_delete, force_delete)
        if dry_run:
            scan = self._scan(paths, report, root_names, keep)
            self._run(
                scan, kb_id, report, progress, delete_missing=delete_missing, recreate=recreate, dry_run=True, limit=limit
            )  # fmt: skip
        else:
            with self.lease(kb_id):
                scan = self._scan(paths, report, root_names, keep)
                self._run(
                    scan, kb_id, report, progress, delete_missing=delete_missing, recreate=recreate, dry_run=False,
                    limit=limit,
                )  # fmt: skip
        report.seconds = time.perf_counter() - started
        return report

    def _scan(
        self, paths: Sequence[Path], report: IndexReport, root_names: Mapping[Path, str] | None, keep: Collection[str]
    ) -> Scan:
        return scan_paths(paths, report, root_names=root_names, keep=keep, load=self._load, hold_chars=self._hold_chars)

    def _run(
        self, scan: Scan, kb_id: str, report: IndexReport, progress: Progress, *,
        delete_missing: bool, recreate: bool, dry_run: bool, limit: DeleteLimit,
    ) -> None:  # fmt: skip
        if not dry_run:
            # Open Milvus before any document write: a Milvus Lite file held by another process must fail
            # the run before it encodes or writes pending rows. A collection created now gets the scanned
            # documents' modules and skill points in its BM25 dictionary.
            terms = front_matter_terms(scan.docs)
            index = self._res.open_leaf_index(terms)
            index.open_kb(kb_id, terms)
            _note_new_terms(report, index, kb_id, scan, self._known_terms(kb_id))
        plan = self._plan(kb_id, scan, report, delete_missing, dry_run, recreate, limit)
        report.unchanged = len(plan.unchanged)
        progress.files_planned(len(plan.to_write) + len(plan.unchanged) + len(plan.to_delete))
        for doc in plan.unchanged:
            progress.file_done(doc.source, "unchanged", 0)
        if dry_run:
            _count_planned(plan, report)
            return
        if self._tokenize is not None and (counted := backfill_term_stats(self._res, kb_id, self._tokenize)):
            report.notes.append(f"term statistics counted for {counted} version(s) indexed before strata kept them")
        if plan.moved:
            self._res.documents.set_roots(kb_id, plan.moved)
        if recreate:
            self._recreate(kb_id, scan, plan, report, progress)
        else:
            self._write_plan(kb_id, scan, plan, report, progress)
        if report.failed == 0:  # a partial re-chunk is not stamped: the failed documents re-chunk next run
            self._res.documents.set_chunking(kb_id, self._signature)

    def _plan(
        self, kb_id: str, scan: Scan, report: IndexReport, delete_missing: bool, dry_run: bool, recreate: bool,
        limit: DeleteLimit,
    ) -> IndexPlan:  # fmt: skip
        signature = self._signature
        encoder = self._res.encoder
        store = self._res.documents
        kb = store.get_kb(kb_id)
        if kb is None and not dry_run:
            kb = store.ensure_kb(kb_id, encoder=encoder.name, dim=encoder.dim, chunking=signature)
        elif kb is not None and not recreate:  # --recreate may change the encoder; it switches at the end
            store.ensure_kb(kb_id, encoder=encoder.name, dim=encoder.dim, chunking=signature)
        if not dry_run:
            retry_invalidations(self._res, kb_id)
        versions = store.versions(kb_id) if kb is not None else []
        if versions and not dry_run and not recreate:
            self._check_leaves_present(kb_id, versions)
        scan = without_root_conflicts(scan, versions, report)
        rechunk = kb is not None and kb.chunking != signature
        if rechunk:
            logger.info("chunking settings of %s changed: its documents are re-chunked", kb_id)
        plan = plan_changes(
            scan, versions, chunking=signature, legacy_ok=not rechunk, delete_missing=delete_missing and not recreate,
            force=recreate, marks=store.version_marks(kb_id), resume=not dry_run and not recreate,
        )  # fmt: skip
        plan = _checked_deletions(kb_id, scan, versions, plan, limit, report, dry_run)
        if recreate:
            _check_recreate_gone(kb_id, scan, versions, report, dry_run)
        if not dry_run:
            resumed = {(item.doc.doc_id, item.version) for item in plan.to_write if item.resumes}
            self._remove_leftovers(kb_id, keep=resumed)
            if resumed:
                report.notes.append(
                    f"{len(resumed)} document(s) continue the pending version a stopped run left: what it wrote is kept"
                )  # fmt: skip
        return plan

    def _check_leaves_present(self, kb_id: str, versions: Sequence[DocumentVersion]) -> None:
        """Refuses a run whose collection lacks the kb's served leaves (STRATA_MILVUS__URI or __COLLECTION
        changed since the kb was indexed, or Milvus restored from an older backup): it would find every document
        unchanged and write nothing, and the kb would answer with no evidence or old text."""
        if not any(v.status == ACTIVE for v in versions):
            return
        check = check_leaves(self._res.leaf_index, kb_id, versions, most=START_PROBES)
        if check.found < check.expected or check.absent_count:
            raise LeavesMissingError(
                f"the Milvus collection {self._res.settings.milvus.collection!r} does not hold the leaves knowledge "
                f"base {kb_id!r} serves in SQL: {check.difference()}. They were written to another Milvus or "
                f"collection, or lost. Point STRATA_MILVUS__URI and STRATA_MILVUS__COLLECTION back at them, or write "
                f"them here from SQL with `strata reconcile --kb {kb_id} --repair`"
            )

    def _recreate(self, kb_id: str, scan: Scan, plan: IndexPlan, report: IndexReport, progress: Progress) -> None:
        """Builds every document as a pending version, then switches the whole kb in one transaction."""
        ready = self._write_plan(kb_id, scan, plan, report, progress, defer=True)
        store = self._res.documents
        if report.failed or not scan.all_complete:
            self._remove_versions([_version_row(kb_id, doc, self._signature) for doc in ready])
            report.notes.append(f"--recreate not switched ({report.failed} failed): the previous knowledge base keeps serving")
            return
        new_ids = {doc.item.doc.doc_id for doc in ready}
        gone = sorted({v.doc_id for v in store.versions(kb_id) if v.status == ACTIVE} - new_ids)
        store.switch(kb_id, [(doc.item.doc.doc_id, doc.item.version) for doc in ready], retire=gone)
        encoder = self._res.encoder
        store.set_encoder(kb_id, encoder=encoder.name, dim=encoder.dim)
        self._checkpoint("activate")
        for doc in ready:
            self._served(doc, report, progress)
        report.deleted += len(gone)
        self._remove_leftovers(kb_id)

    # -- writing ----------------------------------------------------------------

    def _write_plan(
        self, kb_id: str, scan: Scan, plan: IndexPlan, report: IndexReport, progress: Progress, *, defer: bool = False
    ) -> list[_Prepared]:
        """Writes the plan in groups, holding one group's chunks at a time; with ``defer`` the versions stay
        pending and are returned, without their chunks and text (``_finish``)."""
        ready: list[_Prepared] = []
        group: list[_Prepared] = []
        leaves_in_group = 0
        for item in plan.to_write:
            doc = self._prepare(kb_id, scan, item, report)
            if doc is None:
                continue
            if doc.held is None:
                ready += self._write_streamed(kb_id, doc, report, progress, defer=defer)
                continue
            group.append(doc)
            leaves_in_group += doc.leaf_count
            if leaves_in_group >= self._group_leaves:
                ready += self._write_group(kb_id, group, report, progress, defer=defer)
                group, leaves_in_group = [], 0
        if group:
            ready += self._write_group(kb_id, group, report, progress, defer=defer)
        for version in plan.to_delete:
            self.delete_document(kb_id, version.doc_id)
            report.deleted += 1
            progress.file_done(version.source, "deleted", 0)
        return ready

    def _prepare(self, kb_id: str, scan: Scan, item: DocumentPlan, report: IndexReport) -> _Prepared | None:
        """Chunks the document once to check and count it (None when it cannot be indexed: reported, the run
        goes on). Its chunks are kept only while it has at most ``group_leaves`` leaves."""
        whole = self._whole(scan, item, report)
        if whole is None:
            return None
        item = whole
        held: list[Chunk] | None = []
        leaves = count = 0
        tokenize = self._tokenize
        terms: Counter[str] = Counter()
        try:
            for chunk in self._iter_chunks(kb_id, item):
                count += 1
                if chunk.is_leaf:
                    leaves += 1
                    text = search_text(chunk, self._chunking.contextualize)
                    problem = leaf_limit_violation(chunk, text)
                    if problem:
                        record_failure(report, item.doc.source, f"cannot be indexed: {problem}")
                        return None
                    if tokenize is not None:
                        add_terms(terms, text, tokenize)
                if held is not None:
                    held.append(chunk)
                    held = held if leaves <= self._group_leaves else None  # too large to hold: chunked again
        except Exception as exc:  # a chunker or tokenizer bug on one file must not stop the batch
            logger.exception("chunking %s failed", item.doc.source)
            record_failure(report, item.doc.source, f"chunking or counting its terms failed: {exc}")
            return None
        ordered = None if held is None else sorted(held, key=lambda c: c.level)  # L1s, L2s, L3s
        return _Prepared(item, ordered, leaves, count, None if tokenize is None else dict(terms))

    def _whole(self, scan: Scan, item: DocumentPlan, report: IndexReport) -> DocumentPlan | None:
        """``item`` with its document whole (read again when the scan let its text go); None when it cannot
        be (reported; its indexed version is kept). Its size was checked as it was loaded (``LoaderLimits``)."""
        try:
            return replace(item, doc=read_again(scan, item.doc, self._load))
        except LoaderError as exc:
            record_failure(report, item.doc.source, f"{exc} (its indexed version, if any, is kept)")
            return None

    def _iter_chunks(self, kb_id: str, item: DocumentPlan) -> Iterator[Chunk]:
        return iter_chunks(item.doc, kb_id=kb_id, version=item.version, settings=self._chunking)

    def _write_group(
        self, kb_id: str, group: list[_Prepared], report: IndexReport, progress: Progress, *, defer: bool = False
    ) -> list[_Prepared]:
        documents = self._res.documents
        for doc in group:
            documents.write_pending(_version_row(kb_id, doc, self._signature), doc.held or [], doc.term_counts)
        self._checkpoint("sql_pending")
        self._write_leaves(kb_id, group, report, progress, resume=any(doc.item.resumes for doc in group))
        return self._finish(kb_id, group, report, progress, defer=defer)

    def _write_streamed(
        self, kb_id: str, doc: _Prepared, report: IndexReport, progress: Progress, *, defer: bool = False
    ) -> list[_Prepared]:
        """A document too large to hold: its pending version row, then its chunks (SQL), leaves (Milvus) and
        parents (cache) ``group_leaves`` leaves at a time, chunked again; memory is one batch's, not the
        document's. The version stays pending, hidden, until every leaf is written and counted. A resumed
        version (``DocumentPlan.resumes``) keeps its row and writes only the chunks and leaves it lacks."""
        source, row, resume = doc.item.doc.source, _version_row(kb_id, doc, self._signature), doc.item.resumes
        if not resume:
            self._res.documents.write_pending(row, [], doc.term_counts, chunk_count=doc.chunk_count)
        written = 0
        for batch in _batches(self._iter_chunks(kb_id, doc.item), self._group_leaves):
            written += self._write_batch(kb_id, batch, report, progress, resume=resume)
            progress.leaves_written(source, written, doc.leaf_count)
        return self._finish(kb_id, [doc], report, progress, defer=defer)

    def _write_batch(
        self, kb_id: str, batch: list[Chunk], report: IndexReport, progress: Progress, *, resume: bool
    ) -> int:
        """One batch of a streamed document into SQL, Milvus and the cache; returns its number of leaves."""
        self._res.documents.add_chunks(batch, skip_existing=resume)
        self._checkpoint("sql_pending")
        leaves = [c for c in batch if c.is_leaf]
        self._upsert_batch(kb_id, leaves, report, progress, resume=resume)
        # cached before the version serves: its ids are its own and SQL holds them, so a version that never
        # serves has them invalidated with its rows (_remove_versions)
        self._res.parents.put_many([c for c in batch if not c.is_leaf])
        return len(leaves)

    def _finish(
        self, kb_id: str, docs: list[_Prepared], report: IndexReport, progress: Progress, *, defer: bool
    ) -> list[_Prepared]:
        """Flush, check each version's leaf count, then activate the verified ones; returns nothing of them
        (the run lets them go). With ``defer`` (``--recreate``) the verified ones stay pending and are returned
        for the switch with their version rows' fields only: their parents go to the cache now (the ids are
        the pending version's own, and a version that never serves has them invalidated with its rows)."""
        self._checkpoint("milvus_upsert")
        self._res.leaf_index.flush()
        self._checkpoint("milvus_flush")
        verified = [doc for doc in docs if self._verified(kb_id, doc, report)]
        if defer:
            for doc in verified:
                self._cache_parents(doc)
            return [replace(doc, held=None, item=replace(doc.item, doc=without_text(doc.item.doc))) for doc in verified]
        for doc in verified:
            self._res.documents.activate(kb_id, doc.item.doc.doc_id, doc.item.version)
            self._checkpoint("activate")
            self._served(doc, report, progress)
        self._retire_previous(kb_id, [doc.item for doc in docs])
        return []

    def _cache_parents(self, doc: _Prepared) -> None:
        """A held document's parents into the cache (a streamed document's went there batch by batch)."""
        if doc.held is not None:
            self._res.parents.put_many([c for c in doc.held if not c.is_leaf])

    def _write_leaves(
        self, kb_id: str, group: list[_Prepared], report: IndexReport, progress: Progress, *, resume: bool
    ) -> None:
        """Embeds (cache, then encoder) and upserts the group's leaves ``group_leaves`` at a time, with
        progress after every batch."""
        leaves = [(doc.item.doc.source, c) for doc in group for c in doc.held or () if c.is_leaf]
        totals = {doc.item.doc.source: doc.leaf_count for doc in group}
        written: Counter[str] = Counter()
        for start in range(0, len(leaves), self._group_leaves):
            batch = leaves[start : start + self._group_leaves]
            self._upsert_batch(kb_id, [leaf for _, leaf in batch], report, progress, resume=resume)
            for source, count in Counter(source for source, _ in batch).items():
                written[source] += count
                progress.leaves_written(source, written[source], totals[source])

    def _upsert_batch(
        self, kb_id: str, leaves: list[Chunk], report: IndexReport, progress: Progress, *, resume: bool = False
    ) -> None:
        embedded = upsert_leaves(
            self._res, self._res.leaf_index, kb_id, leaves, progress=progress,
            batch_cached=lambda: self._checkpoint(ENCODER_BATCH), keep_present=resume,
        )  # fmt: skip
        report.passages_encoded += embedded.encoded
        report.embeddings_reused += embedded.reused
        report.leaves_kept += embedded.kept
        report.encode_seconds += embedded.seconds

    def _verified(self, kb_id: str, doc: _Prepared, report: IndexReport) -> bool:
        item = doc.item
        found = self._res.leaf_index.count(kb_id, doc_id=item.doc.doc_id, version=item.version)
        if found != doc.leaf_count:
            record_failure(report, item.doc.source, f"Milvus holds {found} leaves, expected {doc.leaf_count}; version not activated")
        return found == doc.leaf_count

    def _served(self, doc: _Prepared, report: IndexReport, progress: Progress) -> None:
        """Bookkeeping once a version serves: parents into the cache (a streamed document's, and those
        ``--recreate`` let go, are there already), counts into the report."""
        self._cache_parents(doc)
        report.chunks_written += doc.chunk_count
        report.leaves_written += doc.leaf_count
        previous = doc.item.previous
        if previous is None:
            report.added += 1
        else:
            report.updated += 1
        progress.file_done(doc.item.doc.source, "updated" if previous else "added", doc.chunk_count)

    def _retire_previous(self, kb_id: str, items: list[DocumentPlan]) -> None:
        retired = [v for v in self._res.documents.versions(kb_id) if v.status != ACTIVE]
        touched = {item.doc.doc_id for item in items}
        self._remove_versions([v for v in retired if v.doc_id in touched])

    def _remove_versions(self, versions: Sequence[DocumentVersion]) -> None:
        """Milvus first, then cache, then SQL: SQL rows outlive their leaves, never the reverse."""
        if not versions:
            return
        self._res.documents.check_fences()
        for v in versions:
            self._res.leaf_index.delete_version(v.kb_id, v.doc_id, v.version)
        self._res.leaf_index.flush()
        self._checkpoint("retire_milvus")
        documents = self._res.documents
        for v in versions:
            self._invalidate_cached(v)
            documents.delete_version(v.kb_id, v.doc_id, v.version)
        self._checkpoint("retire_sql")

    def _invalidate_cached(self, v: DocumentVersion) -> None:
        """Deletes the version's chunks (leaves too: retrieval caches the leaves it reads) from the cache, a
        page of ids at a time; a page that fails is recorded before the rows go: retried, and counted by
        reconcile."""
        documents, failed, error = self._res.documents, 0, None
        for page in documents.version_chunk_ids(v.kb_id, v.doc_id, v.version):
            page_error = self._res.parents.invalidate([(v.kb_id, cid) for cid in page])
            if page_error:
                documents.record_invalidations(v.kb_id, page)
                failed, error = failed + len(page), page_error
        if failed:
            logger.warning(
                "%d cache entries of %s v%d not invalidated (%s): recorded; the next run or "
                "`strata reconcile --kb %s --repair` deletes them", failed, v.doc_id, v.version, error, v.kb_id,
            )  # fmt: skip

    # -- maintenance ------------------------------------------------------------

    def _remove_leftovers(self, kb_id: str, keep: Collection[tuple[str, int]] = ()) -> int:
        """Removes versions a crash left ``pending`` or ``retired``, but those in ``keep`` (doc id, version):
        pending versions this run resumes; returns how many."""
        leftovers = [v for v in self._res.documents.versions(kb_id) if v.status != ACTIVE and (v.doc_id, v.version) not in keep]
        if leftovers:
            logger.info("reconcile %s: removing %d unfinished or retired versions", kb_id, len(leftovers))
        self._remove_versions(leftovers)
        return len(leftovers)

    def reconcile(self, kb_id: str, *, repair: bool = False) -> ReconcileReport:
        """Compares the three stores for a kb; with ``repair`` makes Milvus and the cache agree with SQL."""
        if not repair:
            return check_stores(self._res, kb_id)
        with self.lease(kb_id):
            leftovers = self._remove_leftovers(kb_id)
            return repair_stores(self._res, kb_id, removed_versions=leftovers, page=self._group_leaves)

    def delete_document(self, kb_id: str, doc_id: str) -> bool:
        """Stops serving a document at once, then removes it from every store."""
        versions = self._res.documents.versions(kb_id, doc_id)
        if not versions:
            return False
        _ = self._res.leaf_index  # fail on a held Milvus Lite file before touching SQL
        with self.lease(kb_id):
            self._res.documents.retire_document(kb_id, doc_id)
            self._remove_versions(versions)
            retry_invalidations(self._res, kb_id)
        return True

    def drop_kb(self, kb_id: str) -> None:
        """Deletes a knowledge base everywhere (retire in SQL first, so a crash is recoverable)."""
        store = self._res.documents
        if store.get_kb(kb_id) is None:
            return
        with self.lease(kb_id):
            for doc_id in sorted({v.doc_id for v in store.versions(kb_id)}):
                store.retire_document(kb_id, doc_id)
            store.check_fences()
            self._res.leaf_index.delete_kb(kb_id)
            self._res.leaf_index.flush()
            try:
                self._res.parents.cache.delete_kb(kb_id)
            except StoreError as exc:
                logger.warning("could not clear the parent cache of %s: %s", kb_id, exc)
            store.drop_kb(kb_id)

    def _known_terms(self, kb_id: str) -> frozenset[str] | None:
        """The terms the new-term note may treat as known: the kb's own (None: the collection's dictionary)."""
        if not self._kb_only_notes:
            return None
        return frozenset(Catalog(self._res.documents.engine).vocabulary([kb_id]).terms)

    def _checkpoint(self, step: str) -> None:
        """After each write step: the crash tests' seam, then the lease's fence (a run paused past its lease
        stops here, with ``LeaseLostError``, before it reads or decides anything more)."""
        if self._after_write_step is not None:
            self._after_write_step(step)
        if step != ENCODER_BATCH:
            self._res.documents.check_fences()


def front_matter_terms(docs: Sequence[SourceDocument]) -> list[str]:
    """The modules and skill points of documents' front-matter (terms the BM25 analyzer keeps whole)."""
    terms: dict[str, None] = {}
    for doc in docs:
        if isinstance(doc.metadata.get("module"), str):
            terms[doc.metadata["module"]] = None
        terms.update(dict.fromkeys(str(p) for p in doc.metadata.get("skill_points") or ()))
    return [t for t in terms if t.strip()]


def _note_new_terms(report: IndexReport, index: LeafIndex, kb_id: str, scan: Scan, kb_terms: frozenset[str] | None) -> None:
    """Notes the front-matter terms jieba may split: those the collection's dictionary lacks or, with
    ``kb_terms``, those new to the kb. The dictionary holds every kb's terms of when the collection was
    created, so a note from it would tell a key scoped to one kb which terms other kbs have."""
    dictionary = index.dictionary_for(kb_id)
    if not dictionary and index.analyzer_tokenizer != "jieba":
        return
    terms = dictionary_terms(front_matter_terms(scan.docs))
    new = sorted(terms - (dictionary if kb_terms is None else kb_terms))
    if not new:
        return
    shown = ", ".join(new[:5]) + (" ..." if len(new) > 5 else "")
    if kb_terms is None:
        what = f"not in the BM25 dictionary of this collection ({shown}); jieba may split them"
    else:
        what = (
            f"new to this knowledge base ({shown}); the collection's BM25 dictionary is fixed when the collection is "
            "created, so jieba may split a term added since"
        )
    report.notes.append(
        f"{len(new)} front-matter term(s) {what} until the leaves are rebuilt into a new collection "
        "(strata rebuild --kb KB --collection NEW)"
    )


def _checked_deletions(
    kb_id: str, scan: Scan, versions: Sequence[DocumentVersion], plan: IndexPlan, limit: DeleteLimit,
    report: IndexReport, dry_run: bool,
) -> IndexPlan:  # fmt: skip
    """``plan``, unless ``refuse_deletions`` refuses its deletions: then the run raises before it writes anything,
    so the kb stays as it was and the run again, with the folder fixed or the deletions allowed, does it all at
    once (a scheduled indexer fails visibly instead of serving half a sync). A dry run notes the refusal instead."""
    refusal = refuse_deletions(scan, [v for v in versions if v.status == ACTIVE], plan.to_delete, limit)
    if refusal is None:
        return plan
    what, why = f"{refusal.count} document(s) of knowledge base {kb_id!r}", f"{refusal.reason}; {refusal.remedy}"
    if dry_run:
        report.notes.append(f"--delete-missing would delete {what}, and would be refused: {why}")
        return replace(plan, to_delete=())
    raise DeleteRefusedError(
        f"--delete-missing refused to delete {what}: nothing was deleted or written. {why}", count=refusal.count
    )


def _check_recreate_gone(
    kb_id: str, scan: Scan, versions: Sequence[DocumentVersion], report: IndexReport, dry_run: bool
) -> None:
    """``--recreate`` serves only what it found: the documents it did not find stop serving at its switch. From an
    emptied or unmounted folder that is the whole kb, so ``refuse_deletions``'s empty-root rule holds here too
    (the count and share caps do not: a recreate says what the kb is to hold)."""
    active = [v for v in versions if v.status == ACTIVE]
    found = {doc.doc_id for doc in scan.docs}
    gone = [v for v in active if v.doc_id not in found]
    refusal = refuse_deletions(scan, active, gone, DeleteLimit(max_count=len(gone), force=True))
    if refusal is None:
        return
    what, why = f"{refusal.count} document(s) of knowledge base {kb_id!r}", f"{refusal.reason}; {refusal.remedy}"
    if dry_run:
        report.notes.append(f"--recreate would stop serving {what}, and is refused: {why}")
        return
    raise DeleteRefusedError(f"--recreate refused to stop serving {what}: nothing was written. {why}", count=refusal.count)


def _check_kb_id(kb_id: str) -> None:
    if not kb_id or not kb_id.strip():
        raise ValueError("the knowledge base id must not be empty")
    if len(kb_id.encode("utf-8")) > LIMITS["kb_id"]:
        raise ValueError(f"knowledge base id is {len(kb_id.encode())} bytes, over the limit of {LIMITS['kb_id']}")


def _count_planned(plan: IndexPlan, report: IndexReport) -> None:
    report.added = sum(1 for item in plan.to_write if item.previous is None)
    report.updated = len(plan.to_write) - report.added
    report.deleted = len(plan.to_delete)


@dataclass(frozen=True)
class _Prepared:
    """A document checked, counted and ready to write: ``held`` is its chunks (L1s, L2s, L3s) when it has
    at most ``group_leaves`` leaves, else None (too large to hold: chunked again, a batch at a time)."""

    item: DocumentPlan
    held: list[Chunk] | None
    leaf_count: int
    chunk_count: int
    term_counts: dict[str, int] | None  # None: the analyzer's terms are not counted


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


def _version_row(kb_id: str, doc: _Prepared, signature: str) -> DocumentVersion:
    item = doc.item
    return DocumentVersion(
        kb_id=kb_id,
        doc_id=item.doc.doc_id,
        version=item.version,
        source=item.doc.source,
        content_hash=index_hash(item.doc.content_hash, signature),
        leaf_count=doc.leaf_count,
        metadata=dict(item.doc.metadata),
        root=item.root,
    )
