"""Incremental planning (pure): which documents to add, update, skip or delete.

``run_plan`` reads what a run's plan needs from the stores and calls ``plan_changes`` and ``refuse_deletions``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Literal

from strata.errors import InvalidArgumentError
from strata.types import ACTIVE, PENDING, DocumentVersion, SourceDocument


def index_hash(content_hash: str, chunking: str) -> str:
    """What a stored version records: the file's content hash under one chunking signature.

    A document is unchanged only when both match, so a run that re-chunks some
    documents and fails on others leaves the failed ones to be re-chunked next time.
    """
    return hashlib.sha256(f"{content_hash}:{chunking}".encode()).hexdigest()


WriteOutcome = Literal["added", "updated"]


@dataclass(frozen=True)
class DocumentPlan:
    """A document to write as ``version``; ``previous`` is the version it replaces. ``resumes``: ``version``
    is a pending version a run that stopped before its end wrote from the same content under the same
    chunking (what of it is already written is kept, not written again)."""

    doc: SourceDocument
    version: int
    previous: DocumentVersion | None
    root: str = ""
    resumes: bool = False

    @property
    def outcome(self) -> WriteOutcome:
        """What writing it counts as, in a run's report and its dry run's: ``updated`` when the document had a
        version before, else ``added``."""
        return "added" if self.previous is None else "updated"


@dataclass(frozen=True)
class IndexPlan:
    to_write: tuple[DocumentPlan, ...]
    unchanged: tuple[SourceDocument, ...]
    to_delete: tuple[DocumentVersion, ...]
    moved: dict[str, str] = field(default_factory=dict)  # unchanged doc id -> the root it is now found under
    rehashed: dict[str, tuple[int, str]] = field(default_factory=dict)  # unchanged doc id -> (version, its new hash)


@dataclass(frozen=True)
class Scan:
    """What an indexing run read: the documents, their roots, and what deletion may touch.

    ``complete_roots`` are folders that existed and were walked without an error;
    ``kept`` are doc ids or sources of files that were found but failed to load,
    and folders that were found but not read (a symlinked folder): they and
    everything under them keep their active version; ``all_complete`` is false when any root
    was missing or unreadable. ``released`` are the documents whose text the scan
    let go (their hash and metadata are kept): the file and its root, to read it
    again when it is written.
    """

    docs: tuple[SourceDocument, ...] = ()
    roots: dict[str, str] = field(default_factory=dict)  # doc id -> root folder
    complete_roots: frozenset[str] = frozenset()
    kept: frozenset[str] = frozenset()
    all_complete: bool = True
    released: Mapping[str, tuple[Path, Path]] = field(default_factory=dict)  # doc id -> (file, root)


def plan_changes(
    scan: Scan,
    versions: Sequence[DocumentVersion],
    *,
    chunking: str,
    legacy_ok: bool = False,
    delete_missing: bool = False,
    force: bool = False,
    marks: Mapping[str, int] | None = None,
    resume: bool = False,
    carried: Collection[str] = (),
    rechunked: Collection[str] = (),
) -> IndexPlan:
    """Compares the scanned files with stored versions.

    A file is unchanged when its active version was indexed from the same
    content with the same ``chunking`` (``legacy_ok``: versions stored before
    the chunking was part of the hash count when their plain content hash
    matches). ``force`` rewrites every file (``--recreate``). Anything else gets
    the next free version number: above every stored version and above its
    ``marks`` entry (the highest version it ever served, deleted ones
    included), so a version number, hence a chunk id, that served is never given again.
    With ``resume``, a file to write whose pending version (left by a run that stopped) holds the same
    content under the same ``chunking`` continues that version instead: it never served, and its chunks
    are the ones this run would write. With ``delete_missing``, see ``deletable``. ``carried`` are documents
    found unchanged by their chunks (``upgrades.carried_over``: hashed under another chunker revision or a
    legacy signature), ``rechunked`` documents whose hash matches but whose chunks this chunker makes otherwise.
    """
    active = {v.doc_id: v for v in versions if v.status == ACTIVE}
    latest: dict[str, int] = dict(marks or {})
    for v in versions:
        latest[v.doc_id] = max(latest.get(v.doc_id, 0), v.version)
    pending = {
        (v.doc_id, v.content_hash, v.source, v.root): v.version
        for v in sorted(versions, key=lambda v: v.version)
        if v.status == PENDING
    }
    to_write, unchanged = [], []
    for doc in scan.docs:
        previous = active.get(doc.doc_id)
        root = scan.roots.get(doc.doc_id, "")
        if not force and previous is not None and _unchanged(previous, doc, chunking, legacy_ok, carried, rechunked):
            unchanged.append(doc)
        elif resume and (
            version := pending.get((doc.doc_id, index_hash(doc.content_hash, chunking), doc.source, root))
        ):
            to_write.append(DocumentPlan(doc, version, previous, root, resumes=True))
        else:
            to_write.append(DocumentPlan(doc, latest.get(doc.doc_id, 0) + 1, previous, root))
    to_delete = deletable(scan, active.values()) if delete_missing else []
    moved = {d.doc_id: scan.roots[d.doc_id] for d in unchanged if active[d.doc_id].root != scan.roots.get(d.doc_id, "")}
    return IndexPlan(tuple(to_write), tuple(unchanged), tuple(to_delete), moved)


def deletable(scan: Scan, active: Iterable[DocumentVersion]) -> list[DocumentVersion]:
    """Active documents ``--delete-missing`` may delete: not seen, not kept, and under a root that was read whole.

    A document indexed before roots were recorded (``root == ""``) counts as
    under the run's roots only when every root was read whole. A missing or
    unreadable root deletes nothing.
    """
    if not scan.all_complete:
        return []
    seen = {doc.doc_id for doc in scan.docs} | set(scan.kept)
    out = []
    for v in sorted(active, key=lambda v: v.doc_id):
        in_scope = v.root in scan.complete_roots if v.root else bool(scan.complete_roots)
        if in_scope and v.doc_id not in seen and not _under_kept(v.source, scan.kept):
            out.append(v)
    return out


DELETE_SHARE = 0.5  # a run deleting more than half of what its folders held looks like a sync accident, not pruning
EMPTY_REMEDY = (
    "an empty folder deletes nothing, even with --force: check it (a sync or mount gone wrong?); to remove its "
    "documents on purpose, delete them with `strata delete` or drop the knowledge base"
)


@dataclass(frozen=True)
class DeleteLimit:
    """How much one ``--delete-missing`` run may delete: at most ``max_count`` documents and at most
    ``DELETE_SHARE`` of the active documents under the roots it read whole; ``force`` lifts both caps."""

    max_count: int
    force: bool = False

    def __post_init__(self) -> None:
        if self.max_count < 0:
            raise InvalidArgumentError(f"--max-delete must be 0 or more, not {self.max_count}")


@dataclass(frozen=True)
class DeleteRefusal:
    """Why a run may not delete the ``count`` documents it planned to: ``reason`` names the limit passed,
    ``remedy`` what allows it, if anything does."""

    count: int
    reason: str
    remedy: str


def refuse_deletions(
    scan: Scan, active: Iterable[DocumentVersion], to_delete: Sequence[DocumentVersion], limit: DeleteLimit
) -> DeleteRefusal | None:
    """The refusal of ``to_delete`` (``deletable``'s answer), or None when the run may delete it.

    A root read whole that yielded no document (an emptied or unmounted folder, or one whose every file failed to
    load) deletes nothing, whatever ``limit`` says: emptiness is what a broken sync or mount looks like, and
    deleting a whole folder's documents on purpose is ``strata delete`` or a kb dropped, not an index run.
    """
    if not to_delete:
        return None
    count = len(to_delete)
    empty = sorted(scan.complete_roots - set(scan.roots.values()))
    legacy = any(not v.root for v in to_delete)  # indexed before roots were recorded: perhaps from an empty root
    emptied = [r for r in empty if any(v.root == r for v in to_delete)] or (empty if legacy else [])
    if emptied:
        return DeleteRefusal(count, f"the folder {emptied[0]} holds no document to index", EMPTY_REMEDY)
    if limit.force:
        return None
    in_scope = [v for v in active if (v.root in scan.complete_roots if v.root else bool(scan.complete_roots))]
    if count > DELETE_SHARE * len(in_scope):
        reason = f"{count} of the {len(in_scope)} documents of the folders read, over the limit of {DELETE_SHARE:.0%}"
        return DeleteRefusal(
            count, reason, "if the folder is as it should be, run again with --force (HTTP: force=true)"
        )
    if count > limit.max_count:
        return DeleteRefusal(
            count,
            f"over the limit of {limit.max_count} deletions per run (STRATA_INDEXING__MAX_DELETE)",
            f"if the folder is as it should be, run again with --max-delete {count} or --force "
            f"(HTTP: max_delete={count} or force=true)",
        )
    return None


def _under_kept(source: str, kept: frozenset[str]) -> bool:
    """Whether ``source`` is kept or lies under a kept folder (a symlinked folder that was not followed)."""
    path = PurePosixPath(source)
    return source in kept or any(str(parent) in kept for parent in path.parents if str(parent) != ".")


def _unchanged(
    previous: DocumentVersion,
    doc: SourceDocument,
    chunking: str,
    legacy_ok: bool,
    carried: Collection[str],
    rechunked: Collection[str],
) -> bool:
    if doc.doc_id in carried:
        return True
    return doc.doc_id not in rechunked and _same(previous, doc, chunking, legacy_ok)


def _same(previous: DocumentVersion, doc: SourceDocument, chunking: str, legacy_ok: bool) -> bool:
    if previous.content_hash == index_hash(doc.content_hash, chunking):
        return True
    return legacy_ok and previous.content_hash == doc.content_hash
