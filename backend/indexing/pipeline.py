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
group.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Sequence

from backend.config import ChunkingSettings
from backend.errors import LoaderError, StoreError
from backend.indexing.chunking import chunk_document
from backend.indexing.embedding import embed_texts, search_text
from backend.indexing.loaders import is_supported, iter_source_files, load_document
from backend.indexing.plan import DocumentPlan, IndexPlan, plan_changes
from backend.indexing.report import IndexReport, NoProgress, Progress
from backend.resources import Resources
from backend.stores.sql import ACTIVE, DocumentVersion
from backend.types import Chunk, SourceDocument

logger = logging.getLogger(__name__)

KILL_ENV = "STRATA_TEST_KILL_AT"
WRITE_STEPS = ("sql_pending", "milvus_upsert", "milvus_flush", "activate", "retire_milvus", "retire_sql")


def chunking_signature(settings: ChunkingSettings) -> str:
    """Changes whenever chunk boundaries or search texts would change."""
    return hashlib.sha1(settings.model_dump_json().encode()).hexdigest()[:16]


class Indexer:
    """Indexes folders into one knowledge base, incrementally."""

    def __init__(self, resources: Resources, *, group_leaves: int = 2000) -> None:
        self._res = resources
        self._chunking = resources.settings.chunking
        self._group_leaves = group_leaves
        self._kill_at = os.environ.get(KILL_ENV, "")

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
    ) -> IndexReport:
        """Brings ``kb_id`` in line with the files under ``paths``."""
        progress = progress or NoProgress()
        started = time.perf_counter()
        report = IndexReport(kb=kb_id, dry_run=dry_run)
        if not dry_run:
            # Open Milvus before any SQL write: a Milvus Lite file held by another process must fail
            # the run before it encodes or writes pending rows that could clash with that process's.
            _ = self._res.leaf_index
        if recreate and not dry_run:
            self.drop_kb(kb_id)
        docs = self._load_all(paths, report)
        signature = chunking_signature(self._chunking)
        plan = self._plan(kb_id, docs, signature, delete_missing, dry_run, recreate)
        report.unchanged = len(plan.unchanged)
        progress.files_planned(len(plan.to_write) + len(plan.unchanged) + len(plan.to_delete))
        for doc in plan.unchanged:
            progress.file_done(doc.source, "unchanged", 0)
        if dry_run:
            _count_planned(plan, report)
        else:
            self._write_plan(kb_id, plan, report, progress)
            self._res.documents.set_chunking(kb_id, signature)
        report.seconds = time.perf_counter() - started
        return report

    def _load_all(self, paths: Sequence[Path], report: IndexReport) -> list[SourceDocument]:
        docs: dict[str, SourceDocument] = {}
        for root, files in _files_by_root(paths, report):
            for path in files:
                if not is_supported(path):
                    report.skipped.append({"source": str(path), "reason": f"unsupported file type {path.suffix!r}"})
                    continue
                try:
                    doc = load_document(path, root=root)
                except LoaderError as exc:
                    _fail(report, str(path), str(exc))
                    continue
                if doc.doc_id in docs:
                    _fail(report, str(path), f"duplicate doc_id {doc.doc_id!r} (also {docs[doc.doc_id].source})")
                    continue
                docs[doc.doc_id] = doc
        return list(docs.values())

    def _plan(
        self, kb_id: str, docs: list[SourceDocument], signature: str, delete_missing: bool, dry_run: bool,
        recreate: bool = False,
    ) -> IndexPlan:  # fmt: skip
        encoder = self._res.encoder
        store = self._res.documents
        kb = store.get_kb(kb_id)
        if kb is None and not dry_run:
            kb = store.ensure_kb(kb_id, encoder=encoder.name, dim=encoder.dim, chunking=signature)
        elif kb is not None:
            store.ensure_kb(kb_id, encoder=encoder.name, dim=encoder.dim, chunking=signature)
        if not dry_run:
            self.reconcile(kb_id)
        # a dry run of --recreate plans against the empty kb the recreate would start from
        versions = store.versions(kb_id) if kb is not None and not (dry_run and recreate) else []
        rechunk = kb is not None and kb.chunking != signature
        if rechunk:
            logger.info("chunking settings of %s changed: every document is re-chunked", kb_id)
        return plan_changes(docs, versions, rechunk=rechunk, delete_missing=delete_missing)

    # -- writing ----------------------------------------------------------------

    def _write_plan(self, kb_id: str, plan: IndexPlan, report: IndexReport, progress: Progress) -> None:
        group: list[tuple[DocumentPlan, list[Chunk]]] = []
        leaves_in_group = 0
        for item in plan.to_write:
            try:
                chunks = chunk_document(item.doc, kb_id=kb_id, version=item.version, settings=self._chunking)
            except Exception as exc:  # a chunker bug on one file must not stop the batch
                logger.exception("chunking %s failed", item.doc.source)
                _fail(report, item.doc.source, f"chunking failed: {exc}")
                continue
            group.append((item, chunks))
            leaves_in_group += sum(c.is_leaf for c in chunks)
            if leaves_in_group >= self._group_leaves:
                self._write_group(kb_id, group, report, progress)
                group, leaves_in_group = [], 0
        if group:
            self._write_group(kb_id, group, report, progress)
        for version in plan.to_delete:
            self.delete_document(kb_id, version.doc_id)
            report.deleted += 1
            progress.file_done(version.source, "deleted", 0)

    def _write_group(
        self, kb_id: str, group: list[tuple[DocumentPlan, list[Chunk]]], report: IndexReport, progress: Progress
    ) -> None:
        leaves = [c for _, chunks in group for c in chunks if c.is_leaf]
        texts = [search_text(leaf, self._chunking.contextualize) for leaf in leaves]
        embedded = embed_texts(
            texts, encoder=self._res.encoder, store=self._res.documents,
            batch_size=self._res.settings.embedding.batch_size, progress=progress,
        )  # fmt: skip
        report.passages_encoded += embedded.encoded
        report.embeddings_reused += embedded.reused
        report.encode_seconds += embedded.seconds
        vectors = embedded.vectors
        documents = self._res.documents
        for item, chunks in group:
            documents.write_pending(_version_row(kb_id, item, chunks), chunks)
        self._checkpoint("sql_pending")
        self._res.leaf_index.upsert(leaves, vectors, texts)
        self._checkpoint("milvus_upsert")
        self._res.leaf_index.flush()
        self._checkpoint("milvus_flush")
        for item, chunks in group:
            self._activate(kb_id, item, chunks, report, progress)
        self._retire_previous(kb_id, [item for item, _ in group])

    def _activate(
        self, kb_id: str, item: DocumentPlan, chunks: list[Chunk], report: IndexReport, progress: Progress
    ) -> None:
        expected = sum(c.is_leaf for c in chunks)
        found = self._res.leaf_index.count(kb_id, doc_id=item.doc.doc_id, version=item.version)
        if found != expected:
            _fail(report, item.doc.source, f"Milvus holds {found} leaves, expected {expected}; version not activated")
            return
        self._res.documents.activate(kb_id, item.doc.doc_id, item.version)
        self._checkpoint("activate")
        self._res.parents.put_many([c for c in chunks if not c.is_leaf])
        report.chunks_written += len(chunks)
        report.leaves_written += expected
        if item.previous is None:
            report.added += 1
        else:
            report.updated += 1
        progress.file_done(item.doc.source, "updated" if item.previous else "added", len(chunks))

    def _retire_previous(self, kb_id: str, items: list[DocumentPlan]) -> None:
        retired = [v for v in self._res.documents.versions(kb_id) if v.status != ACTIVE]
        touched = {item.doc.doc_id for item in items}
        self._remove_versions([v for v in retired if v.doc_id in touched])

    def _remove_versions(self, versions: Sequence[DocumentVersion]) -> None:
        """Milvus first, then cache, then SQL: SQL rows outlive their leaves, never the reverse."""
        if not versions:
            return
        for v in versions:
            self._res.leaf_index.delete_version(v.kb_id, v.doc_id, v.version)
        self._res.leaf_index.flush()
        self._checkpoint("retire_milvus")
        documents = self._res.documents
        for v in versions:
            parents = documents.version_chunks(v.kb_id, v.doc_id, v.version, levels=(1, 2))
            self._res.parents.invalidate([(v.kb_id, c.chunk_id) for c in parents])
            documents.delete_version(v.kb_id, v.doc_id, v.version)
        self._checkpoint("retire_sql")

    # -- maintenance ------------------------------------------------------------

    def reconcile(self, kb_id: str) -> int:
        """Removes versions a crash left ``pending`` or ``retired``; returns how many."""
        leftovers = [v for v in self._res.documents.versions(kb_id) if v.status != ACTIVE]
        if leftovers:
            logger.info("reconcile %s: removing %d unfinished or retired versions", kb_id, len(leftovers))
        self._remove_versions(leftovers)
        return len(leftovers)

    def delete_document(self, kb_id: str, doc_id: str) -> bool:
        """Stops serving a document at once, then removes it from every store."""
        versions = self._res.documents.versions(kb_id, doc_id)
        if not versions:
            return False
        _ = self._res.leaf_index  # fail on a held Milvus Lite file before touching SQL
        self._res.documents.retire_document(kb_id, doc_id)
        self._remove_versions(versions)
        return True

    def drop_kb(self, kb_id: str) -> None:
        """Deletes a knowledge base everywhere (retire in SQL first, so a crash is recoverable)."""
        store = self._res.documents
        if store.get_kb(kb_id) is None:
            return
        for doc_id in sorted({v.doc_id for v in store.versions(kb_id)}):
            store.retire_document(kb_id, doc_id)
        self._res.leaf_index.delete_kb(kb_id)
        self._res.leaf_index.flush()
        try:
            self._res.parents.cache.delete_kb(kb_id)
        except StoreError as exc:
            logger.warning("could not clear the parent cache of %s: %s", kb_id, exc)
        store.drop_kb(kb_id)

    def _checkpoint(self, step: str) -> None:
        """Crash-test hook: ``STRATA_TEST_KILL_AT=<step>`` kills the process right after ``step``."""
        if self._kill_at == step:
            logger.warning("%s=%s: killing the indexer", KILL_ENV, step)
            os.kill(os.getpid(), signal.SIGKILL)


def _files_by_root(paths: Sequence[Path], report: IndexReport) -> list[tuple[Path, list[Path]]]:
    out = []
    for path in paths:
        root = path if path.is_dir() else path.parent
        try:
            out.append((root, iter_source_files([path])))
        except LoaderError as exc:
            _fail(report, str(path), str(exc))
    return out


def _fail(report: IndexReport, source: str, reason: str) -> None:
    logger.warning("failed: %s: %s", source, reason)
    report.failed += 1
    report.failures.append({"source": source, "reason": reason})


def _count_planned(plan: IndexPlan, report: IndexReport) -> None:
    report.added = sum(1 for item in plan.to_write if item.previous is None)
    report.updated = len(plan.to_write) - report.added
    report.deleted = len(plan.to_delete)


def _version_row(kb_id: str, item: DocumentPlan, chunks: list[Chunk]) -> DocumentVersion:
    return DocumentVersion(
        kb_id=kb_id,
        doc_id=item.doc.doc_id,
        version=item.version,
        source=item.doc.source,
        content_hash=item.doc.content_hash,
        leaf_count=sum(c.is_leaf for c in chunks),
        metadata=dict(item.doc.metadata),
    )

