"""Removing versions, documents and whole kbs from the three stores, in the order that keeps a crash recoverable.

SQL is the source of truth, so its rows outlive what the other stores hold of them, never the reverse:
a version's leaves leave Milvus first (``retire_milvus``), then its cache entries and SQL rows
(``retire_sql``). A document or a kb stops serving first (retired in SQL, one transaction), so a crash
part way leaves retired rows that the next run or ``strata reconcile --repair`` removes.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence

from strata.errors import StoreError
from strata.indexing.reconcile import retry_invalidations
from strata.indexing.run import Checkpoint, WriteStep
from strata.resources import Resources
from strata.types import ACTIVE, DocumentVersion

logger = logging.getLogger(__name__)


class Removal:
    """Removes what a kb no longer serves, passing ``checkpoint`` after each removal step."""

    def __init__(self, resources: Resources, checkpoint: Checkpoint) -> None:
        self._res = resources
        self._checkpoint = checkpoint

    def remove_versions(self, versions: Sequence[DocumentVersion]) -> None:
        """Milvus first, then cache, then SQL: SQL rows outlive their leaves, never the reverse. Before any
        delete, a fenced transaction marks the versions abandoned (``retired``): a run paused between that
        and its deletes cannot lose served data, since no run continues or serves a retired version."""
        if not versions:
            return
        # A bug if it raises (not input): callers retire a document before removing its versions.
        if any(v.status == ACTIVE for v in versions):
            raise ValueError("remove_versions removes versions that do not serve; retire the document first")
        self._res.documents.versions.abandon(versions)
        for v in versions:
            self._res.leaf_index.delete_version(v.kb_id, v.doc_id, v.version)
        self._res.leaf_index.flush()
        self._checkpoint(WriteStep.RETIRE_MILVUS)
        for v in versions:
            self._invalidate_cached(v)
            self._res.documents.versions.delete_version(v.kb_id, v.doc_id, v.version)
        self._checkpoint(WriteStep.RETIRE_SQL)

    def remove_retired(self, kb_id: str, doc_ids: Collection[str]) -> None:
        """Removes the versions of ``doc_ids`` that do not serve: those a group's activation retired, and a
        version of the group that failed its check."""
        retired = [v for v in self._res.documents.versions.of_kb(kb_id) if v.status != ACTIVE and v.doc_id in doc_ids]
        self.remove_versions(retired)

    def remove_leftovers(self, kb_id: str, keep: Collection[tuple[str, int]] = ()) -> int:
        """Removes versions a crash left ``pending`` or ``retired``, but those in ``keep`` (doc id, version):
        pending versions this run resumes; returns how many."""
        versions = self._res.documents.versions.of_kb(kb_id)
        leftovers = [v for v in versions if v.status != ACTIVE and (v.doc_id, v.version) not in keep]
        if leftovers:
            logger.info("reconcile %s: removing %d unfinished or retired versions", kb_id, len(leftovers))
        self.remove_versions(leftovers)
        return len(leftovers)

    def delete_document(self, kb_id: str, doc_id: str) -> bool:
        """Stops serving a document at once, then removes it from every store; False when the kb has no such
        document. The caller holds the kb's lease."""
        if not self._res.documents.versions.of_kb(kb_id, doc_id):
            return False
        self._res.documents.versions.retire_document(kb_id, doc_id)
        self.remove_versions(self._res.documents.versions.of_kb(kb_id, doc_id))
        retry_invalidations(self._res, kb_id)
        return True

    def drop_kb(self, kb_id: str) -> None:
        """Deletes a knowledge base everywhere (retired in SQL first, so a crash is recoverable). The caller holds
        the kb's lease. Leaves go version by version, never by kb: a run paused here past its lease must not
        delete what a newer run writes into a kb of the same name."""
        store = self._res.documents
        for doc_id in sorted({v.doc_id for v in store.versions.of_kb(kb_id)}):
            store.versions.retire_document(kb_id, doc_id)
        self.remove_versions(store.versions.of_kb(kb_id))
        store.check_fences()
        self._res.leaf_index.drop_empty_kb(kb_id)
        try:
            self._res.cached_chunks.cache.delete_kb(kb_id)
        except StoreError as exc:
            logger.warning("could not clear the parent cache of %s: %s", kb_id, exc)
        store.kbs.drop_kb(kb_id)

    def _invalidate_cached(self, v: DocumentVersion) -> None:
        """Deletes the version's chunks (leaves too: retrieval caches the leaves it reads) from the cache, a
        page of ids at a time; a page that fails is recorded before the rows go: retried, and counted by
        reconcile."""
        documents, failed, error = self._res.documents, 0, None
        for page in documents.chunks.version_chunk_ids(v.kb_id, v.doc_id, v.version):
            page_error = self._res.cached_chunks.invalidate([(v.kb_id, cid) for cid in page])
            if page_error:
                documents.invalidations.record_invalidations(v.kb_id, page)
                failed, error = failed + len(page), page_error
        if failed:
            logger.warning(
                "%d cache entries of %s v%d not invalidated (%s): recorded; the next run or "
                "`strata reconcile --kb %s --repair` deletes them",
                failed,
                v.doc_id,
                v.version,
                error,
                v.kb_id,
            )
