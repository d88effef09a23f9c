"""Incremental planning (pure): which documents to add, update, skip or delete."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterable, Mapping, Sequence

from strata.types import ACTIVE, DocumentVersion, SourceDocument


def index_hash(content_hash: str, chunking: str) -> str:
    """What a stored version records: the file's content hash under one chunking signature.

    A document is unchanged only when both match, so a run that re-chunks some
    documents and fails on others leaves the failed ones to be re-chunked next time.
    """
    return hashlib.sha256(f"{content_hash}:{chunking}".encode()).hexdigest()


@dataclass(frozen=True)
class DocumentPlan:
    """A document to write as ``version``; ``previous`` is the version it replaces."""

    doc: SourceDocument
    version: int
    previous: DocumentVersion | None
    root: str = ""


@dataclass(frozen=True)
class IndexPlan:
    to_write: tuple[DocumentPlan, ...]
    unchanged: tuple[SourceDocument, ...]
    to_delete: tuple[DocumentVersion, ...]
    moved: dict[str, str] = field(default_factory=dict)  # unchanged doc id -> the root it is now found under


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
) -> IndexPlan:
    """Compares the scanned files with stored versions.

    A file is unchanged when its active version was indexed from the same
    content with the same ``chunking`` (``legacy_ok``: versions stored before
    the chunking was part of the hash count when their plain content hash
    matches). ``force`` rewrites every file (``--recreate``). Anything else gets
    the next free version number: above every stored version and above its
    ``marks`` entry (the highest version it ever served, deleted ones
    included), so a version number, hence a chunk id, that served is never given again.
    With ``delete_missing``, see ``deletable``.
    """
    active = {v.doc_id: v for v in versions if v.status == ACTIVE}
    latest: dict[str, int] = dict(marks or {})
    for v in versions:
        latest[v.doc_id] = max(latest.get(v.doc_id, 0), v.version)
    to_write, unchanged = [], []
    for doc in scan.docs:
        previous = active.get(doc.doc_id)
        if not force and previous is not None and _same(previous, doc, chunking, legacy_ok):
            unchanged.append(doc)
        else:
            to_write.append(DocumentPlan(doc, latest.get(doc.doc_id, 0) + 1, previous, scan.roots.get(doc.doc_id, "")))
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


def _under_kept(source: str, kept: frozenset[str]) -> bool:
    """Whether ``source`` is kept or lies under a kept folder (a symlinked folder that was not followed)."""
    path = PurePosixPath(source)
    return source in kept or any(str(parent) in kept for parent in path.parents if str(parent) != ".")


def _same(previous: DocumentVersion, doc: SourceDocument, chunking: str, legacy_ok: bool) -> bool:
    if previous.content_hash == index_hash(doc.content_hash, chunking):
        return True
    return legacy_ok and previous.content_hash == doc.content_hash
