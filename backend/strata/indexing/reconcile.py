"""``strata reconcile``: compare the three stores of a kb with SQL, and repair them on request.

SQL is the source of truth. Milvus must hold exactly the leaves of the active
versions; the chunk cache may hold only chunks of active versions, and no
cache invalidation may be left recorded as failed; every active version has
its term statistics (BM25 query hygiene). Repair deletes orphan leaves, writes
missing ones again (vectors from the embedding cache, encoding only what is
not cached), drops stale cache entries (the recorded ones too) and counts the
terms of versions that lack them.

The embedding cache may hold more than the served leaves use (that is what
lets an edit reuse its unchanged passages), so its unused vectors are counted
(``unused_embeddings``, not a difference) and ``--repair`` deletes them: after
it, the cache holds exactly the vectors of the served leaves' search texts with
the configured encoder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from strata.errors import CacheError
from strata.indexing.embedding import search_text, text_hash, upsert_leaves
from strata.indexing.report import NoProgress
from strata.indexing.terms import backfill_term_stats, term_tokenizer
from strata.resources import Resources
from strata.stores.analyzer import Tokenize
from strata.types import ACTIVE, LEAF_LEVEL

logger = logging.getLogger(__name__)

_SHOWN = 10


@dataclass
class ReconcileReport:
    """What differs between the stores of one kb (ids: up to ten of each, as examples)."""

    kb: str
    leftover_versions: int = 0
    missing_in_milvus: int = 0
    orphans_in_milvus: int = 0
    stale_cache: int | None = 0  # None: the cache could not be read
    invalidations_pending: int = 0  # cache entries of removed versions whose deletion failed (recorded in SQL)
    versions_without_term_stats: int = 0
    unused_embeddings: int = (
        0  # cached vectors no served leaf uses (edits, deletions, another encoder): not a difference
    )
    repaired: bool = False
    examples: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def differences(self) -> int:
        found = self.leftover_versions + self.missing_in_milvus + self.orphans_in_milvus + (self.stale_cache or 0)
        return found + self.versions_without_term_stats + self.invalidations_pending

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "differences": self.differences}


@dataclass(frozen=True)
class _Diff:
    missing: set[str]
    orphans: set[str]
    stale: set[str] | None


def check_stores(resources: Resources, kb_id: str) -> ReconcileReport:
    """The differences, without changing anything."""
    report = ReconcileReport(kb=kb_id)
    report.leftover_versions = sum(v.status != ACTIVE for v in resources.documents.versions.of_kb(kb_id))
    report.invalidations_pending = resources.documents.invalidations.count_invalidations(kb_id)
    _fill(report, _diff(resources, kb_id, report))
    if _tokenizer(resources, report) is not None:
        report.versions_without_term_stats = len(resources.documents.terms.uncounted_versions(kb_id))
    report.unused_embeddings = len(unused_embeddings(resources, kb_id))
    return report


def repair_stores(resources: Resources, kb_id: str, *, removed_versions: int = 0, page: int = 2000) -> ReconcileReport:
    """Makes Milvus and the cache agree with SQL, missing leaves written ``page`` at a time; the report counts
    what was found (and fixed)."""
    report = ReconcileReport(kb=kb_id, leftover_versions=removed_versions, repaired=True)
    report.invalidations_pending, error = retry_invalidations(resources, kb_id)
    if error:
        report.notes.append(f"recorded cache invalidations not done: {error}")
    diff = _diff(resources, kb_id, report)
    _fill(report, diff)
    if diff.orphans:
        resources.leaf_index.delete_leaves(kb_id, sorted(diff.orphans))
    if diff.missing:
        _rewrite_leaves(resources, kb_id, sorted(diff.missing), page)
    if diff.orphans or diff.missing:
        resources.leaf_index.flush()
    if diff.stale:
        error = resources.cached_chunks.invalidate([(kb_id, cid) for cid in sorted(diff.stale)])
        if error:
            report.notes.append(f"stale cache entries not removed: {error}")
    tokenize = _tokenizer(resources, report)
    if tokenize is not None:
        report.versions_without_term_stats = backfill_term_stats(resources, kb_id, tokenize)
        resources.documents.terms.rebuild_kb_terms(kb_id)  # the kb's term sums, whatever drifted
    unused = unused_embeddings(resources, kb_id)
    resources.documents.embeddings.drop_embeddings(kb_id, sorted(unused))
    report.unused_embeddings = len(unused)
    return report


def unused_embeddings(resources: Resources, kb_id: str, page: int = 2000) -> set[tuple[str, str]]:
    """The kb's cached (encoder, text hash) keys that no served leaf's search text with the kb's encoder has
    (the name SQL records: no model is loaded); the served leaves are read a page at a time."""
    documents = resources.documents
    kb = documents.kbs.get_kb(kb_id)
    if kb is None:
        return set()
    encoder = kb.encoder
    contextualize = resources.settings.chunking.contextualize
    used: set[tuple[str, str]] = set()
    for version in documents.versions.of_kb(kb_id):
        if version.status != ACTIVE:
            continue
        for leaves in documents.chunks.version_chunk_pages(
            kb_id, version.doc_id, version.version, levels=(LEAF_LEVEL,), page=page
        ):
            used.update((encoder, text_hash(search_text(leaf, contextualize))) for leaf in leaves)
    return documents.embeddings.cached_keys(kb_id) - used


def retry_invalidations(resources: Resources, kb_id: str) -> tuple[int, str | None]:
    """Deletes the kb's cache entries whose invalidation failed earlier; returns (how many were
    recorded, the cache's error if they are still there)."""
    documents = resources.documents
    pending = documents.invalidations.pending_invalidations(kb_id)
    if not pending:
        return 0, None
    error = resources.cached_chunks.invalidate([(kb_id, cid) for cid in pending])
    if error is None:
        documents.invalidations.clear_invalidations(kb_id, pending)
        logger.info("deleted %d cache entries of %s whose invalidation had failed", len(pending), kb_id)
    return len(pending), error


def _tokenizer(resources: Resources, report: ReconcileReport) -> Tokenize | None:
    tokenize, why_not = term_tokenizer(resources)
    if why_not:
        report.notes.append(why_not)
    return tokenize


def _diff(resources: Resources, kb_id: str, report: ReconcileReport) -> _Diff:
    documents = resources.documents
    leaves = documents.chunks.active_chunk_ids(kb_id, levels=(3,))
    in_milvus = set(resources.leaf_index.leaf_ids(kb_id))
    try:
        cached = set(resources.cached_chunks.cache.keys(kb_id))
        stale: set[str] | None = (
            cached - documents.chunks.active_chunk_ids(kb_id, levels=(1, 2, 3)) if cached else set()
        )
    except CacheError as exc:
        report.notes.append(f"parent cache not checked: {exc}")
        stale = None
    return _Diff(missing=leaves - in_milvus, orphans=in_milvus - leaves, stale=stale)


def _fill(report: ReconcileReport, diff: _Diff) -> None:
    report.missing_in_milvus = len(diff.missing)
    report.orphans_in_milvus = len(diff.orphans)
    report.stale_cache = None if diff.stale is None else len(diff.stale)
    for name, ids in (
        ("missing_in_milvus", diff.missing),
        ("orphans_in_milvus", diff.orphans),
        ("stale_cache", diff.stale),
    ):
        if ids:
            report.examples[name] = sorted(ids)[:_SHOWN]


def _rewrite_leaves(resources: Resources, kb_id: str, chunk_ids: list[str], page: int) -> None:
    """Reads, embeds and upserts the missing leaves ``page`` at a time (a kb whose collection lost all
    200,000 of its leaves is not held whole)."""
    for start in range(0, len(chunk_ids), page):
        leaves = list(resources.documents.chunks.get_chunks(chunk_ids[start : start + page]).values())
        embedded = upsert_leaves(resources, resources.leaf_index, kb_id, leaves, progress=NoProgress())
        done = start + len(leaves)
        logger.info("reconcile: wrote %d of %d missing leaves (%d encoded)", done, len(chunk_ids), embedded.encoded)
