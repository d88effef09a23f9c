"""Source files to ``SourceDocument``: one loader per format, chosen by suffix.

Every loader returns normalized text (see ``normalize_text``) and sections that
tile it: consecutive ``Section`` spans from offset 0 to ``len(text)``, each
starting at its heading line (or page). Problems are reported as ``LoaderError``
with a short reason; text is never truncated.

Formats: Markdown with optional YAML front matter (ATX headings give sections;
MkDocs admonitions and content tabs read as text), reStructuredText (docutils'
section nesting gives the same heading paths; Sphinx roles and directives
tolerated), plain text (one section, heading path ``()``), HTML
(``<h1>``-``<h3>`` give sections), PDF (one section per page) and DOCX
("Title"/"Heading n" paragraph styles give sections).

No loader reads another file: an include (reStructuredText's ``include``,
``literalinclude``, ``:file:`` options; MkDocs' ``--8<--`` snippets) is left
out of the text and reported as a note (``Parsed.notes``), as is markup the
parser refused (a docutils error: a malformed table, a title that skips a
level; a MkDocs admonition or tab with nothing under it or an unclosed title, a
snippet block or code fence never closed). ``load_document`` logs each note as a
warning naming the file and keeps the first ``MAX_NOTES`` in
``SourceDocument.notes``; an indexing run lists them per file in its report
(``IndexReport.warnings``).

Each file is bounded by ``LoaderLimits`` (``STRATA_INDEXING__*``): its bytes,
and what it decompresses to; its elements (paragraphs, pages, tags, comments,
headings, reStructuredText lines); and, since every format parses in a worker
process of a pool (``_isolated``), the parse's time and memory. Its text's UTF-8 is bounded by
``max_document_bytes`` in the worker, before the text comes back, and a .txt or
.md file, whose text is its bytes, before it is read: over twice that bound
(``LoaderLimits.check_text_file``). A file over a bound fails with one line naming
the setting. ``stop``, when set, ends a parse in progress with
``IndexingStoppedError``: a stopping service does not wait for a parser.

Everything strata applies to the text (normalization, headings, front matter,
the HTML breaks, MkDocs markers) is linear in its length: each regular
expression starts a match only where a run of what it rescans begins, or the
line is scanned by hand; ``tests/indexing/test_linear_text.py`` and
``tests/indexing/test_mkdocs_markdown.py`` feed each a megabyte of its worst
input. docutils is not linear in a paragraph's length; ``_rst`` parses inline
text in bounded pieces (``tests/indexing/test_rst_loader.py``).

The private modules hold the pieces: ``_text`` (normalization and section
assembly shared by every format), ``_markdown`` (Markdown and plain text),
``_rst``, ``_html``, ``_pdf`` and ``_docx``, with ``_limits``, and ``_isolated`` (the pool of parse
workers), ``_worker`` (one worker) and ``_frames`` (what they say over their pipes).
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import logging
import os
import stat
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from strata.errors import IndexingStoppedError, LoaderError
from strata.indexing.loaders._isolated import parse_isolated
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.loaders._text import Parsed, normalize_text
from strata.types import SourceDocument

__all__ = [
    "SUPPORTED_SUFFIXES",
    "FolderWalk",
    "LoaderLimits",
    "is_supported",
    "iter_source_files",
    "load_document",
    "normalize_text",
    "unreadable_reason",
    "walk_folder",
]

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES: frozenset[str] = frozenset({".md", ".markdown", ".rst", ".txt", ".html", ".htm", ".pdf", ".docx"})


def is_supported(path: Path) -> bool:
    """Whether ``load_document`` has a loader for this file's suffix."""
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def iter_source_files(paths: Sequence[Path]) -> list[Path]:
    """Expand files and folders into regular, non-hidden files.

    Folders are walked recursively in sorted order, skipping hidden entries
    (``.git``, ``.DS_Store``); files named explicitly are kept as given.
    Unsupported files are returned too, so the caller can report them.
    """
    found: dict[Path, None] = {}  # an ordered set: overlapping arguments list a file once
    for path in paths:
        if path.is_dir():
            found.update(dict.fromkeys(_walk(path)))
        elif path.is_file():
            found[path] = None
        else:
            raise LoaderError(f"no such file or directory: {path}")
    return list(found)


class FolderWalk(NamedTuple):
    """What walking one folder found, every entry accounted for (hidden ones aside)."""

    files: list[Path]  # regular files, or symlinks to them
    unreadable: list[tuple[Path, str]]  # entries that exist but cannot be read as a file, with the reason
    skipped: list[tuple[Path, str]]  # entries not followed (symlinked folders), with the reason
    errors: list[str]  # folders that could not be read


def walk_folder(folder: Path) -> FolderWalk:
    """The files under ``folder`` (as ``iter_source_files`` walks them) and every entry that is not one."""
    walk = FolderWalk([], [], [], [])
    walk.files.extend(_walk(folder, walk))
    return walk


def unreadable_reason(path: Path) -> str | None:
    """Why ``path`` cannot be read as a file (a dangling symlink, a FIFO ...), or None for a regular file.

    Only ``stat`` is called: opening a FIFO would block until a writer comes.
    """
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop (it never reaches a file)"
        if exc.errno == errno.ENOENT and path.is_symlink():
            return f"dangling symlink (its target {os.readlink(path)} does not exist)"
        return f"cannot read: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    return f"not a regular file ({_FILE_KINDS.get(stat.S_IFMT(mode), 'a special file')})"


_FILE_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
}


def _walk(folder: Path, walk: FolderWalk | None = None) -> Iterator[Path]:
    def unreadable_folder(exc: OSError) -> None:
        if walk is not None:
            walk.errors.append(f"cannot read folder {exc.filename}: {exc.strerror or exc}")

    for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable_folder):
        # Pruning in place stops os.walk from descending into hidden folders; it never follows a symlinked one.
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        if walk is not None:
            linked = [Path(dirpath, d) for d in dirnames if Path(dirpath, d).is_symlink()]
            walk.skipped.extend((path, "symlink to a folder (not followed)") for path in linked)
        for name in sorted(n for n in filenames if not n.startswith(".")):
            path = Path(dirpath, name)
            reason = unreadable_reason(path)
            if reason is None:
                yield path
            elif walk is not None:
                walk.unreadable.append((path, reason))


def load_document(
    path: Path, *, root: Path | None = None, limits: LoaderLimits = LoaderLimits(), stop: threading.Event | None = None
) -> SourceDocument:
    """Load one file into a ``SourceDocument``.

    ``source`` is the path relative to ``root`` as a POSIX string (the file
    name when ``root`` is None); ``doc_id`` is the Markdown front-matter
    ``doc_id`` when given, else ``source``. Raises ``LoaderError``, or
    ``IndexingStoppedError`` once ``stop`` is set.
    """
    if stop is not None and stop.is_set():
        raise IndexingStoppedError("indexing stopped before this file was read: the service is shutting down")
    suffix = path.suffix.lower()
    parse = _PARSERS.get(suffix)
    if parse is None:
        raise LoaderError(f"unsupported file type '{suffix}'" if suffix else "unsupported file type (no suffix)")
    source = _relative_source(path, root)
    raw = _read_bytes(path, limits, text_is_the_file=suffix in _TEXT_IS_THE_FILE)
    parsed = parse_isolated(parse, raw, limits, stop)
    if not parsed.text:
        raise LoaderError("empty file")
    doc_id = str(parsed.metadata.get("doc_id") or "").strip() or source
    notes = _bounded(parsed.notes)
    for note in notes:
        logger.warning("%s: %s", source, note)
    logger.debug("loaded %s: %d characters, %d sections", source, len(parsed.text), len(parsed.sections))
    return SourceDocument(
        doc_id=doc_id,
        source=source,
        text=parsed.text,
        sections=parsed.sections,
        metadata=parsed.metadata,
        content_hash=hashlib.sha256(raw).hexdigest(),
        notes=notes,
    )


MAX_NOTES = 20  # a file's notes past these are counted in one more: a page of 10,000 snippets is not 10,000 lines


def _bounded(notes: tuple[str, ...]) -> tuple[str, ...]:
    if len(notes) <= MAX_NOTES:
        return notes
    return (
        *notes[:MAX_NOTES],
        f"{len(notes) - MAX_NOTES:,} more notes like these (only the first {MAX_NOTES} are listed)",
    )


def _relative_source(path: Path, root: Path | None) -> str:
    if root is None:
        return path.name
    # abspath, not resolve(): a symlink inside root keeps its path under root.
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        raise LoaderError(f"file is outside the root folder {root}") from None


def _read_bytes(path: Path, limits: LoaderLimits, *, text_is_the_file: bool) -> bytes:
    # O_NONBLOCK: a FIFO put in the file's place after the walk fails here instead of blocking the run.
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            status = os.fstat(file.fileno())
            if not stat.S_ISREG(status.st_mode):
                raise LoaderError(unreadable_reason(path) or "not a regular file")
            limits.check_bytes("the file is", status.st_size)  # what a file decompresses to is at least its size
            if text_is_the_file:
                limits.check_text_file(status.st_size)
            # read(n) allocates n bytes first: its size, not the limit (256 MB for every file), then what it grew by
            raw = file.read(status.st_size + 1)
            if len(raw) > status.st_size:
                raw += file.read(limits.max_decompressed_bytes + 1 - len(raw))
    except OSError as exc:
        raise LoaderError(unreadable_reason(path) or f"cannot read file: {exc.strerror or exc}") from exc
    if not raw:
        raise LoaderError("empty file")
    limits.check_bytes("the file is at least", len(raw))  # it grew after fstat
    return raw


# Formats whose text is the file's bytes decoded, only normalized: the file's size tells the text's (check_text_file).
_TEXT_IS_THE_FILE = frozenset({".md", ".markdown", ".txt"})


@dataclass(frozen=True)
class _Parser:
    """A parser by its module's and function's names: what the parse worker imports and calls.

    The parse workers have imported every parser's module (``_worker``); this process imports none of
    them (python-docx, pypdf, lxml, docutils: 0.3 s of a ``strata`` command's start on a 2-core VM, for
    commands that parse nothing or parse only in a worker).
    """

    module: str
    name: str

    def __call__(self, raw: bytes, limits: LoaderLimits) -> Parsed:
        parse = getattr(importlib.import_module(f"strata.indexing.loaders.{self.module}"), self.name)
        return parse(raw, limits)


_PARSERS: dict[str, _Parser] = {
    ".md": _Parser("_markdown", "parse_markdown"),
    ".markdown": _Parser("_markdown", "parse_markdown"),
    ".rst": _Parser("_rst", "parse_rst"),
    ".txt": _Parser("_markdown", "parse_plain_text"),
    ".html": _Parser("_html", "parse_html"),
    ".htm": _Parser("_html", "parse_html"),
    ".pdf": _Parser("_pdf", "parse_pdf"),
    ".docx": _Parser("_docx", "parse_docx"),
}
