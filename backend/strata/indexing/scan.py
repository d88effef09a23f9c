"""Reading the paths of an indexing run into a ``Scan``: documents, their roots and what may be deleted.

A folder argument is a root: its documents record it, and ``--delete-missing``
may delete only documents of roots that exist and were walked without an
error. A file argument is indexed but scopes no deletion. A file that fails
to load, and an entry that exists but cannot be read (a dangling symlink, a
symlink loop, a FIFO), is reported as a failure and keeps its active version;
entries not indexed on purpose (unsupported types, symlinked folders) are
listed as skipped, and what was indexed under a symlinked folder is kept. Every entry but a hidden one is accounted for in the report.
A file that loads with notes (an unresolved include, markup its parser refused) is indexed, and each note
is one of the report's ``warnings``, naming the file as a failure would.

A run holds the text and sections of its first documents, up to ``hold_bytes`` of them
(``held_bytes``: the text's size in memory and its sections' objects); the text of the rest
is let go once its hash and metadata are taken, and read again (``read_again``) when the
document is written, so what a run holds grows with its folder by each document's id, hash
and metadata, not by its text. A file that changed in between fails, keeping its indexed
version, and the next run indexes it.

A document id is the path relative to its root (or a front-matter ``doc_id``),
so two folders indexed into one kb can name the same id (``teamA/README.md``
and ``teamB/README.md`` are both ``README.md``). ``without_root_conflicts``
refuses the second one, naming both files, instead of replacing the first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from strata.errors import LoaderError
from strata.indexing.loaders import is_supported, load_document, unreadable_reason, walk_folder
from strata.indexing.plan import Scan
from strata.indexing.report import Failure, IndexReport
from strata.types import ACTIVE, DocumentVersion, SourceDocument

Load = Callable[..., SourceDocument]  # load_document(path, root=...), perhaps with the run's limits bound

HOLD_BYTES = 8 * 2**20  # documents a run holds from its scan to its writes; beyond it, documents are read twice
SECTION_BYTES = 400  # a held section's objects: its heading path's strings and tuple, its offsets (tracemalloc)


def held_bytes(doc: SourceDocument) -> int:
    """What holding ``doc`` whole costs over holding its id, hash and metadata: its text and its sections."""
    return sys.getsizeof(doc.text) + SECTION_BYTES * len(doc.sections)


def scan_paths(
    paths: Sequence[Path],
    report: IndexReport,
    *,
    root_names: Mapping[Path, str] | None = None,
    keep: Collection[str] = (),
    load: Load = load_document,
    hold_bytes: int = HOLD_BYTES,
) -> Scan:
    """``root_names`` record a folder under another name than its absolute path (an upload: the client's
    folder); ``keep`` are sources that failed where the files were read (their indexed versions are kept);
    ``load`` reads one file (``load_document`` with the run's ``LoaderLimits`` and stop event); the text
    of documents past the first ``hold_bytes`` is released (see the module docstring)."""
    docs: dict[str, SourceDocument] = {}
    roots: dict[str, str] = {}
    released: dict[str, tuple[Path, Path]] = {}
    complete: set[str] = set()
    kept: set[str] = set(keep)
    all_complete = True
    for path in paths:
        files, root, whole = _files(path, report, kept)
        name = (root_names or {}).get(path, root)
        all_complete &= whole
        if whole and path.is_dir():
            complete.add(name)
        for file in files:
            doc = _load(file, Path(root), report, docs, kept, load)
            if doc is None:
                continue
            hold_bytes -= held_bytes(doc)
            if hold_bytes < 0:
                doc, released[doc.doc_id] = without_text(doc), (file, Path(root))
            docs[doc.doc_id], roots[doc.doc_id] = doc, name
    return Scan(tuple(docs.values()), roots, frozenset(complete), frozenset(kept), all_complete, released)


def without_text(doc: SourceDocument) -> SourceDocument:
    """What is kept of a document once its text is let go: its id, source, hash and metadata."""
    return replace(doc, text="", sections=())


def read_again(scan: Scan, doc: SourceDocument, load: Load) -> SourceDocument:
    """``doc`` whole: itself, or, when the scan released its text, its file read again. Raises
    ``LoaderError`` when the file cannot be read now or no longer holds what the run planned from."""
    where = scan.released.get(doc.doc_id)
    if where is None:
        return doc
    file, root = where
    if not os.path.lexists(file):
        raise LoaderError("the file was removed while the run was indexing; the next run sees it gone")
    again = load(file, root=root)
    if (again.doc_id, again.content_hash) != (doc.doc_id, doc.content_hash):
        raise LoaderError("the file changed while the run was indexing; the next run indexes its new content")
    return again


def _files(path: Path, report: IndexReport, kept: set[str]) -> tuple[list[Path], str, bool]:
    """The files of one argument, its root folder, and whether it was read whole."""
    if path.is_dir():
        root = os.path.abspath(path)
        walk = walk_folder(path)
        for error in walk.errors:
            report.file_failed(str(path), error)
        for entry, reason in walk.unreadable:
            _unreadable(entry, reason, Path(root), report, kept)
        for entry, reason in walk.skipped:
            report.file_skipped(str(entry), reason)
        # a folder not followed was not read: what was indexed under it is kept, never deleted as missing
        kept.update(Path(os.path.abspath(entry)).relative_to(root).as_posix() for entry, _ in walk.skipped)
        return walk.files, root, not walk.errors
    root = os.path.abspath(path.parent)
    if not os.path.lexists(path):
        report.file_failed(str(path), "no such file or directory (nothing under it was deleted)")
        return [], os.path.abspath(path), False
    unreadable = unreadable_reason(path)
    if unreadable is not None:
        _unreadable(path, unreadable, Path(root), report, kept)
        return [], root, True
    return [path], root, True


def _unreadable(path: Path, reason: str, root: Path, report: IndexReport, kept: set[str]) -> None:
    """An entry that exists but cannot be read: a failure that keeps its indexed version.

    One of a type strata does not index anyway (``notes``, ``x.png``) is skipped, with the same reason; it is
    kept all the same, since it may be a folder that is not there now (a symlink to an unmounted share).
    """
    kept.add(Path(os.path.abspath(path)).relative_to(root).as_posix())
    if not is_supported(path):
        report.file_skipped(str(path), reason)
        return
    report.file_failed(str(path), f"{reason} (its indexed version, if any, is kept)")


def _load(
    path: Path, root: Path, report: IndexReport, docs: dict[str, SourceDocument], kept: set[str], load: Load
) -> SourceDocument | None:
    """The loaded document, or None (reported; a file that failed keeps its indexed version)."""
    if not is_supported(path):
        report.file_skipped(str(path), f"unsupported file type {path.suffix!r}")
        return None
    source = Path(os.path.abspath(path)).relative_to(root).as_posix()
    try:
        doc = load(path, root=root)
    except LoaderError as exc:
        report.file_failed(str(path), f"{exc} (its indexed version, if any, is kept)")
        kept.add(source)
        return None
    if doc.doc_id in docs:
        report.file_failed(str(path), f"duplicate doc_id {doc.doc_id!r} (also {docs[doc.doc_id].source})")
        kept.add(source)
        return None
    report.file_warnings(str(path), doc.notes)
    return doc


def without_root_conflicts(scan: Scan, versions: Iterable[DocumentVersion]) -> tuple[Scan, tuple[Failure, ...]]:
    """``scan`` without the documents whose id an active document of another root holds, and a failure for each,
    naming both files (the run lists them; the indexed one keeps serving and ``--delete-missing`` leaves it
    alone). Reads only."""
    active = {v.doc_id: v for v in versions if v.status == ACTIVE}
    refused: dict[str, Failure] = {}
    for doc in scan.docs:
        previous = active.get(doc.doc_id)
        root = scan.roots.get(doc.doc_id, "")
        if previous is not None and _other_document(previous, root, doc.source):
            old, new = _shown(previous.root, previous.source), _shown(root, doc.source)
            refused[doc.doc_id] = Failure(
                new,
                f"document id {doc.doc_id!r} is already indexed from {old}, another folder; not replaced. Index each "
                "folder into a kb of its own, index their common parent folder, or delete the indexed one first",
            )
    if not refused:
        return scan, ()
    docs = tuple(d for d in scan.docs if d.doc_id not in refused)
    return replace(scan, docs=docs, kept=scan.kept | set(refused)), tuple(refused.values())


def _other_document(previous: DocumentVersion, root: str, source: str) -> bool:
    """True when ``root``/``source`` is not the file ``previous`` was indexed from, nor where it moved.

    A root recorded before roots were (``""``) matches anything. A local root (an absolute path) whose
    file is gone means the folder moved (or an upload's temporary folder was removed): the same document.
    A folder of the same name elsewhere is the same folder copied (a checkout or CI workspace at a new
    path, a copied data dir): its documents are updated, as before. A root named by a client (an
    upload) has nothing on disk to look at: another name is another folder.
    """
    if not previous.root or previous.root == root:
        return False
    old = Path(previous.root) / previous.source
    if os.path.isabs(previous.root) and not os.path.lexists(old):
        return False
    if os.path.isabs(previous.root) and os.path.isabs(root) and Path(previous.root).name == Path(root).name:
        return False
    try:
        return not os.path.samefile(old, Path(root) / source)
    except OSError:
        return True


def _shown(root: str, source: str) -> str:
    return str(Path(root) / source) if root else source
