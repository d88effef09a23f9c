"""The indexing pipeline: load → chunk → encode L3 → write, incrementally.

Write order makes partial work invisible and reruns safe (ids are
deterministic, so a rerun overwrites instead of duplicating):

1. SQL: the new document version as ``pending`` with all its chunks (a batch's
   chunks before the batch's leaves go to Milvus);
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

A run is a sequence of steps, each in its module: scan (``scan``), prepare the
kb (here: open Milvus, create the kb row, retry recorded cache invalidations),
plan (``run_plan``: reads only), remove what a crash left (``removal``), write
(``writer``: one loop over batches from ``source``, whatever a document's size)
and serve: each group as it is written, or, for ``--recreate``, every version
in one switch at the end. The write steps are ``run.WriteStep``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from strata.config import ChunkingSettings
from strata.errors import InvalidArgumentError, LeaseLostError
from strata.indexing.loaders import LoaderLimits, load_document
from strata.indexing.new_terms import front_matter_terms, note_new_terms
from strata.indexing.plan import DeleteLimit, IndexPlan, Scan
from strata.indexing.reconcile import (
    ReconcileReport,
    check_stores,
    repair_stores,
    retry_invalidations,
)
from strata.indexing.removal import Removal
from strata.indexing.report import IndexReport, NoProgress, Progress
from strata.indexing.run import (
    ENCODER_BATCH,
    WRITE_STEPS,
    Checkpoint,
    IndexRun,
    WriteStep,
)
from strata.indexing.run_plan import RunOptions, plan_run
from strata.indexing.scan import HOLD_BYTES, read_again, scan_paths
from strata.indexing.source import ChunkSource
from strata.indexing.term_counting import WorkerTermCounter
from strata.indexing.terms import backfill_term_stats, term_tokenizer
from strata.indexing.upgrades import settings_signature, stamp
from strata.indexing.writer import VersionWriter, WrittenVersion
from strata.resources import Resources
from strata.stores.catalog import Catalog
from strata.stores.leaf_schema import LIMITS
from strata.stores.lease import KbLease
from strata.types import ACTIVE, DocumentVersion

__all__ = ["ENCODER_BATCH", "WRITE_STEPS", "Indexer", "WriteStep", "chunking_signature", "front_matter_terms"]

logger = logging.getLogger(__name__)


def chunking_signature(settings: ChunkingSettings) -> str:
    """What versions are hashed under: the chunking settings (a document indexed under others is chunked again by
    the next run). The chunker's revision is the kb's ``upgrades.stamp``: a document it would chunk alike stays
    as it is across releases (``upgrades.carried_over``)."""
    return settings_signature(settings)


class Indexer:
    """Indexes folders into one knowledge base, incrementally, holding the kb's lease while it writes."""

    def __init__(
        self,
        resources: Resources,
        *,
        group_leaves: int = 2000,
        lease_ttl_s: float | None = None,
        kb_only_notes: bool = False,
        after_write_step: Callable[[str], None] | None = None,
        hold_bytes: int = HOLD_BYTES,
    ) -> None:
        """``kb_only_notes``: the report names nothing learned from other kbs (the service, whose keys may be
        scoped to some kbs); without it the notes may name what the collection's BM25 dictionary lacks.
        ``hold_bytes``: the documents a run holds whole from its scan to its writes (``scan_paths``).
        ``after_write_step`` is called with the name of each step (``WRITE_STEPS``, ``ENCODER_BATCH``) right
        after it: the crash tests' seam (tests/kill_at_launcher.py kills the process there)."""
        self._res = resources
        self._kb_only_notes = kb_only_notes
        self._chunking = resources.settings.chunking
        self._signature = chunking_signature(self._chunking)
        self._stamp = stamp(self._chunking)  # the kb's record of settings and chunker revision
        self._group_leaves = group_leaves  # also the leaves looked up, encoded and upserted at a time
        self._stopping = threading.Event()
        self._limits = LoaderLimits.from_settings(resources.settings.indexing)
        self._load = functools.partial(load_document, limits=self._limits, stop=self._stopping)
        self._lease_ttl_s = lease_ttl_s if lease_ttl_s is not None else resources.settings.indexing.lease_ttl_s
        self._hold_bytes = hold_bytes
        self._leases: dict[str, KbLease] = {}
        # the fence is looked up when passed: building an indexer opens no store
        self._checkpoint = Checkpoint(
            fences=lambda: resources.documents.check_fences(), after_write_step=after_write_step, stop=self._stopping
        )
        self._removal = Removal(resources, self._checkpoint)
        self._tokenize, why_not = term_tokenizer(resources)  # None: the analyzer's terms cannot be counted here
        if why_not:
            logger.info(why_not)

    def stop(self) -> None:
        """Stops the runs in progress at their next write step (``Checkpoint``: a batch boundary; a parse in
        progress is killed) and refuses new ones: they raise ``IndexingStoppedError``, releasing their leases.
        For a service shutting down."""
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
        document as a new version and switches to them all at once at the end, or, if anything failed, keeps
        the old kb serving.
        ``root_names`` and ``keep`` are for uploads (see ``scan_paths``).
        """
        _check_kb_id(kb_id)
        started = time.perf_counter()
        run = IndexRun(kb_id, IndexReport(kb=kb_id, dry_run=dry_run), progress or NoProgress(), self._checkpoint)
        limit = DeleteLimit(self._res.settings.indexing.max_delete if max_delete is None else max_delete, force_delete)
        options = RunOptions(delete_missing=delete_missing, recreate=recreate, dry_run=dry_run, limit=limit)
        if dry_run:
            self._dry_run(run, self._scan(paths, run.report, root_names, keep), options)
        else:
            with self.lease(kb_id):
                try:
                    self._run(run, self._scan(paths, run.report, root_names, keep), options)
                except LeaseLostError:
                    self._withdraw(run)
                    raise
        run.report.finished(time.perf_counter() - started)
        return run.report

    def _scan(
        self, paths: Sequence[Path], report: IndexReport, root_names: Mapping[Path, str] | None, keep: Collection[str]
    ) -> Scan:
        return scan_paths(paths, report, root_names=root_names, keep=keep, load=self._load, hold_bytes=self._hold_bytes)

    def _dry_run(self, run: IndexRun, scan: Scan, options: RunOptions) -> None:
        """What the run would do, in the report: nothing is opened or written. An existing kb built with another
        encoder is refused as a run would refuse it (``ensure_kb`` of an existing kb checks and writes nothing)."""
        encoder, store = self._res.encoder, self._res.documents
        if not options.recreate and store.kbs.get_kb(run.kb_id) is not None:
            store.kbs.ensure_kb(run.kb_id, encoder=encoder.name, dim=encoder.dim, chunking=self._stamp)
        run.report.would_write(self._plan(run, scan, options))

    def _run(self, run: IndexRun, scan: Scan, options: RunOptions) -> None:
        self._prepare_kb(run, scan, options)
        plan = self._plan(run, scan, options)
        self._remove_leftovers(run, plan)
        if self._tokenize is not None and (counted := backfill_term_stats(self._res, run.kb_id, self._tokenize)):
            run.report.noted(f"term statistics counted for {counted} version(s) indexed before strata kept them")
        if plan.moved:
            self._res.documents.versions.set_roots(run.kb_id, plan.moved)
        if plan.rehashed:  # unchanged documents hashed under a legacy signature: under the settings signature now
            self._res.documents.versions.set_hashes(run.kb_id, plan.rehashed)
        if options.recreate:
            self._recreate(run, scan, plan)
        else:
            self._write_changes(run, scan, plan)
        if run.report.failed == 0:  # a partial re-chunk is not stamped: the failed documents re-chunk next run
            self._res.documents.kbs.set_chunking(run.kb_id, self._stamp)

    def _prepare_kb(self, run: IndexRun, scan: Scan, options: RunOptions) -> None:
        """Opens Milvus and the kb's collection before any document write: a Milvus Lite file held by another
        process must fail the run before it encodes or writes pending rows; a collection created here gets the
        scanned documents' modules and skill points in its BM25 dictionary (``LeafIndex.open_kb``). Then the kb's row (created, or its encoder checked: not for a
        ``--recreate``, which may change the encoder and records it at its switch) and the cache
        invalidations an earlier run recorded as failed, retried."""
        kb_id, encoder, store = run.kb_id, self._res.encoder, self._res.documents
        terms = front_matter_terms(scan.docs)
        index = self._res.open_leaf_index()
        index.open_kb(kb_id, terms)
        note_new_terms(run.report, index, kb_id, scan, self._known_terms(kb_id))
        if not options.recreate or store.kbs.get_kb(kb_id) is None:
            store.kbs.ensure_kb(kb_id, encoder=encoder.name, dim=encoder.dim, chunking=self._stamp)
        retry_invalidations(self._res, kb_id)

    def _plan(self, run: IndexRun, scan: Scan, options: RunOptions) -> IndexPlan:
        """Plans (``run_plan``: reads and refusals only), then puts what planning found in the report."""
        read = functools.partial(read_again, scan, load=self._load)
        planned = plan_run(self._res, run.kb_id, scan, options, signature=self._signature, read=read)
        for failure in planned.failures:
            run.report.file_failed(failure.source, failure.reason)
        run.report.noted(*planned.notes)
        plan = planned.plan
        run.report.planned(plan)
        run.progress.files_planned(len(plan.to_write) + len(plan.unchanged) + len(plan.to_delete))
        for doc in plan.unchanged:
            run.progress.file_done(doc.source, "unchanged", 0)
        return plan

    def _remove_leftovers(self, run: IndexRun, plan: IndexPlan) -> None:
        """Removes what an earlier run left pending or retired, but the pending versions this run continues."""
        resumed = {(item.doc.doc_id, item.version) for item in plan.to_write if item.resumes}
        self._removal.remove_leftovers(run.kb_id, keep=resumed)
        if resumed:
            run.report.noted(
                f"{len(resumed)} document(s) continue the pending version a stopped run left: what it wrote is kept"
            )

    def _writer(self, run: IndexRun) -> VersionWriter:
        count = None
        if self._tokenize is not None:  # on a parse worker, with the dictionary of the kb's collection
            dictionary = self._res.leaf_index.dictionary_for(run.kb_id)
            count = WorkerTermCounter(self._tokenize, dictionary, self._limits, self._stopping)
        source = ChunkSource(
            run.kb_id, self._chunking, group_leaves=self._group_leaves, load=self._load, count_terms=count
        )
        return VersionWriter(self._res, run, source, group_leaves=self._group_leaves, signature=self._signature)

    def _write_changes(self, run: IndexRun, scan: Scan, plan: IndexPlan) -> None:
        """Writes the plan a group at a time, each group serving as soon as it is written and checked; then
        deletes what ``--delete-missing`` planned to."""
        writer = self._writer(run)
        for group in writer.write(scan, plan.to_write):
            if group.verified:
                writer.serve(group.verified)
            self._removal.remove_retired(run.kb_id, group.doc_ids)
        for version in plan.to_delete:
            self.delete_document(run.kb_id, version.doc_id)
            run.report.documents_deleted(1)
            run.progress.file_done(version.source, "deleted", 0)

    def _recreate(self, run: IndexRun, scan: Scan, plan: IndexPlan) -> None:
        """``--recreate``: every document written as a pending version, then the switch of the whole kb in one
        transaction; if anything failed (or a root could not be read), none of it serves."""
        writer = self._writer(run)
        ready = [v for group in writer.write(scan, plan.to_write) for v in group.verified]
        if run.report.failed or not scan.all_complete:
            self._removal.remove_versions([v.row for v in ready])
            run.report.noted(
                f"--recreate not switched ({run.report.failed} failed): the previous knowledge base keeps serving"
            )
            return
        self._switch_all(run, writer, ready, plan.to_delete)

    def _switch_all(
        self, run: IndexRun, writer: VersionWriter, ready: Sequence[WrittenVersion], gone: Sequence[DocumentVersion]
    ) -> None:
        """``--recreate``'s switch: ``ready`` serves and ``gone`` (planned: every document it did not find) stops
        serving, in one transaction; then the kb's previous versions are removed."""
        writer.serve(ready, retire=[v.doc_id for v in gone])
        run.report.documents_deleted(len(gone))
        for version in gone:
            run.progress.file_done(version.source, "deleted", 0)
        self._removal.remove_leftovers(run.kb_id)

    def _withdraw(self, run: IndexRun) -> None:
        """A run that lost its lease removes what it wrote outside SQL: the leaves of its versions that do not
        serve, and the chunks it cached. It may: the run that took the lease retired those versions in the
        transaction that took it (``KbLease``), never continues a retired version nor gives its number again.
        A write of this run that was on the wire when it was paused has landed by now, so nothing of it
        stays behind as an orphan. Best effort: what fails here is what ``strata reconcile --repair`` finds."""
        writes, kb_id = run.writes, run.kb_id
        try:
            serving = {(v.doc_id, v.version) for v in self._res.documents.versions.of_kb(kb_id) if v.status == ACTIVE}
            withdrawn = sorted((writes.versions | set(writes.cached)) - serving)
            for doc_id, version in withdrawn:
                self._res.leaf_index.delete_version(kb_id, doc_id, version)
            if withdrawn:
                self._res.leaf_index.flush()
            cached = [(kb_id, chunk_id) for version in withdrawn for chunk_id in writes.cached.get(version, ())]
            if cached:
                self._res.cached_chunks.invalidate(cached)
        except Exception as exc:
            logger.warning("a run that lost the lease of %s could not withdraw its writes: %s", kb_id, exc)
            return
        if withdrawn:
            logger.warning(
                "withdrew the leaves of %d version(s) this run wrote before it lost the lease of %s",
                len(withdrawn),
                kb_id,
            )

    # -- maintenance ------------------------------------------------------------

    def reconcile(self, kb_id: str, *, repair: bool = False) -> ReconcileReport:
        """Compares the three stores for a kb; with ``repair`` makes Milvus and the cache agree with SQL."""
        if not repair:
            return check_stores(self._res, kb_id)
        with self.lease(kb_id):
            leftovers = self._removal.remove_leftovers(kb_id)
            return repair_stores(self._res, kb_id, removed_versions=leftovers, page=self._group_leaves)

    def delete_document(self, kb_id: str, doc_id: str) -> bool:
        """Stops serving a document at once, then removes it from every store."""
        if not self._res.documents.versions.of_kb(kb_id, doc_id):
            return False
        self._res.open_leaf_index()  # fail on a held Milvus Lite file before touching SQL
        with self.lease(kb_id):
            return self._removal.delete_document(kb_id, doc_id)

    def drop_kb(self, kb_id: str) -> None:
        """Deletes a knowledge base everywhere (retire in SQL first, so a crash is recoverable)."""
        if self._res.documents.kbs.get_kb(kb_id) is None:
            return
        with self.lease(kb_id):
            self._removal.drop_kb(kb_id)

    def _known_terms(self, kb_id: str) -> frozenset[str] | None:
        """The terms the new-term note may treat as known: the kb's own (None: the collection's dictionary)."""
        if not self._kb_only_notes:
            return None
        return frozenset(Catalog(self._res.documents.engine).vocabulary([kb_id]).terms)


def _check_kb_id(kb_id: str) -> None:
    if not kb_id or not kb_id.strip():
        raise InvalidArgumentError("the knowledge base id must not be empty")
    if len(kb_id.encode("utf-8")) > LIMITS["kb_id"]:
        size = len(kb_id.encode("utf-8"))
        raise InvalidArgumentError(f"knowledge base id is {size} bytes, over the limit of {LIMITS['kb_id']}")
