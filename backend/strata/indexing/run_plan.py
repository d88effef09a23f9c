"""A run's plan from what the stores hold: it reads and refuses, and writes nothing, not even to the report.

``plan.plan_changes`` compares the scan with the stored versions (pure); this adds what a run must
read or refuse before it writes: the kb's versions and chunking, the check that Milvus holds the
leaves SQL serves, and the refusals of deletions that look like a sync accident. A refusal raises
before anything is written; a dry run notes it instead. What planning found for the report (the
documents it refused, the notes) comes back in its ``PlannedRun``, and the run puts it in its report.
The kb is prepared (created, its recorded cache invalidations retried) by the run before it plans,
and what a crash left is removed after.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace

from strata.errors import DeleteRefusedError, LeavesMissingError
from strata.indexing.consistency import check_leaves
from strata.indexing.plan import (
    DeleteLimit,
    IndexPlan,
    Scan,
    plan_changes,
    refuse_deletions,
)
from strata.indexing.report import Failure
from strata.indexing.scan import without_root_conflicts
from strata.indexing.upgrades import Carried, Read, carried_over, same_settings
from strata.resources import Resources
from strata.types import ACTIVE, DocumentVersion

logger = logging.getLogger(__name__)

START_PROBES = 1000  # served versions a run's start probes in Milvus by id (`strata stats` probes every one)


@dataclass(frozen=True)
class RunOptions:
    """What an ``index_paths`` call asks for (see its docstring)."""

    delete_missing: bool
    recreate: bool
    dry_run: bool
    limit: DeleteLimit


@dataclass(frozen=True)
class PlannedRun:
    """What planning found: the plan, and what the run's report is to say of it (the run puts it there)."""

    plan: IndexPlan
    failures: tuple[Failure, ...] = ()
    """scanned documents not planned: their id is served from another root (each failure names both files)"""
    notes: tuple[str, ...] = ()
    """the refusals a dry run met instead of raising"""


def plan_run(
    resources: Resources, kb_id: str, scan: Scan, options: RunOptions, *, signature: str, read: Read
) -> PlannedRun:
    """The documents to write, keep and delete, and what the report is to say of them. Raises
    ``LeavesMissingError`` or ``DeleteRefusedError`` (not in a dry run) before the run writes anything.
    ``signature`` is the settings signature versions are hashed under; ``read`` gives a document whole (its
    text read again when the scan let it go), for the chunks a chunker upgrade compares (``upgrades``)."""
    store = resources.documents
    kb = store.kbs.get_kb(kb_id)
    versions = store.versions.of_kb(kb_id) if kb is not None else []
    live = not options.dry_run and not options.recreate  # --recreate writes every version anew: nothing to resume
    if versions and live:
        check_leaves_present(resources, kb_id, versions)
    scan, failures = without_root_conflicts(scan, versions)
    settings = resources.settings.chunking
    rechunk = kb is not None and not same_settings(kb.chunking, settings)
    if rechunk:
        logger.info("chunking settings of %s changed: its documents are re-chunked", kb_id)
    carried = Carried()
    if kb is not None and not rechunk and not options.recreate:
        carried = carried_over(
            resources.documents.chunks, kb_id, kb.chunking, scan.docs, versions, settings=settings, read=read
        )
    plan = plan_changes(
        scan,
        versions,
        chunking=signature,
        legacy_ok=not rechunk,
        delete_missing=options.delete_missing and not options.recreate,
        force=options.recreate,
        marks=store.versions.version_marks(kb_id),
        resume=live,
        carried=carried.unchanged,
        rechunked=carried.rechunked,
    )
    plan = replace(plan, rehashed=carried.rehashed)
    if options.recreate:  # it deletes what it did not find, with or without --delete-missing
        plan, refused = _recreate_gone(kb_id, scan, versions, plan, options.dry_run)
    else:
        plan, refused = _checked_deletions(kb_id, scan, versions, plan, options)
    return PlannedRun(plan, failures, (refused,) if refused else ())


def check_leaves_present(resources: Resources, kb_id: str, versions: Sequence[DocumentVersion]) -> None:
    """Refuses a run whose collection lacks the kb's served leaves (STRATA_MILVUS__URI or __COLLECTION
    changed since the kb was indexed, or Milvus restored from an older backup): it would find every document
    unchanged and write nothing, and the kb would answer with no evidence or old text."""
    if not any(v.status == ACTIVE for v in versions):
        return
    check = check_leaves(resources.leaf_index, kb_id, versions, most=START_PROBES)
    if check.found < check.expected or check.absent_count:
        # a run paused past its lease read versions another run has replaced since: that is the lost lease
        resources.documents.check_fences()
        raise LeavesMissingError(
            f"the Milvus collection {resources.settings.milvus.collection!r} does not hold the leaves knowledge "
            f"base {kb_id!r} serves in SQL: {check.difference()}. They were written to another Milvus or "
            f"collection, or lost. Point STRATA_MILVUS__URI and STRATA_MILVUS__COLLECTION back at them, or write "
            f"them here from SQL with `strata reconcile --kb {kb_id} --repair`"
        )


def _checked_deletions(
    kb_id: str,
    scan: Scan,
    versions: Sequence[DocumentVersion],
    plan: IndexPlan,
    options: RunOptions,
) -> tuple[IndexPlan, str | None]:
    """``plan``, unless ``refuse_deletions`` refuses its deletions: then the run raises before it writes anything,
    so the kb stays as it was and the run again, with the folder fixed or the deletions allowed, does it all at
    once (a scheduled indexer fails visibly instead of serving half a sync). A dry run gets the plan without its
    deletions and a note of the refusal instead."""
    refusal = refuse_deletions(scan, [v for v in versions if v.status == ACTIVE], plan.to_delete, options.limit)
    if refusal is None:
        return plan, None
    what, why = f"{refusal.count} document(s) of knowledge base {kb_id!r}", f"{refusal.reason}; {refusal.remedy}"
    if options.dry_run:
        return replace(plan, to_delete=()), f"--delete-missing would delete {what}, and would be refused: {why}"
    raise DeleteRefusedError(
        f"--delete-missing refused to delete {what}: nothing was deleted or written. {why}", count=refusal.count
    )


def _recreate_gone(
    kb_id: str, scan: Scan, versions: Sequence[DocumentVersion], plan: IndexPlan, dry_run: bool
) -> tuple[IndexPlan, str | None]:
    """``plan`` deleting what ``--recreate`` stops serving at its switch: the documents it did not find. From an
    emptied or unmounted folder that is the whole kb, so ``refuse_deletions``'s empty-root rule holds here too
    (the count and share caps do not: a recreate says what the kb is to hold). A dry run gets the plan without
    its deletions and a note of the refusal instead."""
    active = [v for v in versions if v.status == ACTIVE]
    found = {doc.doc_id for doc in scan.docs}
    gone = tuple(v for v in active if v.doc_id not in found)
    refusal = refuse_deletions(scan, active, gone, DeleteLimit(max_count=len(gone), force=True))
    if refusal is None:
        return replace(plan, to_delete=gone), None
    what, why = f"{refusal.count} document(s) of knowledge base {kb_id!r}", f"{refusal.reason}; {refusal.remedy}"
    if dry_run:
        return replace(plan, to_delete=()), f"--recreate would stop serving {what}, and is refused: {why}"
    raise DeleteRefusedError(
        f"--recreate refused to stop serving {what}: nothing was written. {why}", count=refusal.count
    )
