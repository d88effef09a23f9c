"""Source files to ``SourceDocument``: one loader per format, chosen by suffix.

Every loader returns normalized text (see ``normalize_text``) and sections that
tile it: consecutive ``Section`` spans from offset 0 to ``len(text)``, each
starting at its heading line (or page). Problems are reported as ``LoaderError``
with a short reason; text is never truncated.

Formats: Markdown with optional YAML front matter (ATX headings give sections),
plain text (one section, heading path ``()``), HTML (``<h1>``-``<h3>`` give
sections), PDF (one section per page) and DOCX ("Title"/"Heading n" paragraph
styles give sections).

The private modules hold the pieces: ``_text`` (normalization and section
assembly shared by every format), ``_markdown`` (Markdown and plain text),
``_html``, ``_pdf`` and ``_docx``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Callable, Iterator, Sequence

from strata.errors import LoaderError
from strata.indexing.loaders._docx import parse_docx
from strata.indexing.loaders._html import parse_html
from strata.indexing.loaders._markdown import parse_markdown, parse_text
from strata.indexing.loaders._pdf import parse_pdf
from strata.indexing.loaders._text import Parsed, normalize_text
from strata.types import SourceDocument

__all__ = ["SUPPORTED_SUFFIXES", "is_supported", "iter_source_files", "load_document", "normalize_text", "walk_folder"]

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES: frozenset[str] = frozenset({".md", ".markdown", ".txt", ".html", ".htm", ".pdf", ".docx"})


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


def walk_folder(folder: Path) -> tuple[list[Path], list[str]]:
    """The files under ``folder`` (as ``iter_source_files`` walks them) and the folders that could not be read."""
    errors: list[str] = []
    files = list(_walk(folder, errors))
    return files, errors


def _walk(folder: Path, errors: list[str] | None = None) -> Iterator[Path]:
    def unreadable(exc: OSError) -> None:
        if errors is not None:
            errors.append(f"cannot read folder {exc.filename}: {exc.strerror or exc}")

    for dirpath, dirnames, filenames in os.walk(folder, onerror=unreadable):
        # Pruning in place stops os.walk from descending into hidden folders.
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if not name.startswith(".") and path.is_file():
                yield path


def load_document(path: Path, *, root: Path | None = None) -> SourceDocument:
    """Load one file into a ``SourceDocument``.

    ``source`` is the path relative to ``root`` as a POSIX string (the file
    name when ``root`` is None); ``doc_id`` is the Markdown front-matter
    ``doc_id`` when given, else ``source``. Raises ``LoaderError``.
    """
    suffix = path.suffix.lower()
    parse = _PARSERS.get(suffix)
    if parse is None:
        raise LoaderError(f"unsupported file type '{suffix}'" if suffix else "unsupported file type (no suffix)")
    source = _relative_source(path, root)
    raw = _read_bytes(path)
    parsed = parse(raw)
    if not parsed.text:
        raise LoaderError("empty file")
    doc_id = str(parsed.metadata.get("doc_id") or "").strip() or source
    logger.debug("loaded %s: %d characters, %d sections", source, len(parsed.text), len(parsed.sections))
    return SourceDocument(
        doc_id=doc_id,
        source=source,
        text=parsed.text,
        sections=parsed.sections,
        metadata=parsed.metadata,
        content_hash=hashlib.sha256(raw).hexdigest(),
    )


def _relative_source(path: Path, root: Path | None) -> str:
    if root is None:
        return path.name
    # abspath, not resolve(): a symlink inside root keeps its path under root.
    try:
        return Path(os.path.abspath(path)).relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        raise LoaderError(f"file is outside the root folder {root}") from None


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise LoaderError(f"cannot read file: {exc.strerror or exc}") from exc
    if not raw:
        raise LoaderError("empty file")
    return raw


_PARSERS: dict[str, Callable[[bytes], Parsed]] = {
    ".md": parse_markdown,
    ".markdown": parse_markdown,
    ".txt": parse_text,
    ".html": parse_html,
    ".htm": parse_html,
    ".pdf": parse_pdf,
    ".docx": parse_docx,
}
