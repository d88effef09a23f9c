"""Source files to ``SourceDocument``: one loader per format, chosen by suffix.

Every loader returns normalized text (see ``normalize_text``) and sections that
tile it: consecutive ``Section`` spans from offset 0 to ``len(text)``, each
starting at its heading line (or page). Problems are reported as ``LoaderError``
with a short reason; text is never truncated.

Formats: Markdown with optional YAML front matter (ATX headings give sections),
plain text (one section, heading path ``()``), HTML (``<h1>``-``<h3>`` give
sections), PDF (one section per page) and DOCX ("Title"/"Heading n" paragraph
styles give sections).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import logging
import os
import re
import unicodedata
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import docx
import yaml
from bs4 import BeautifulSoup, NavigableString, Tag
from docx.table import Table
from docx.text.paragraph import Paragraph
from pypdf import PdfReader

from backend.errors import LoaderError
from backend.types import Section, SourceDocument

logger = logging.getLogger(__name__)

SUPPORTED_SUFFIXES: frozenset[str] = frozenset({".md", ".markdown", ".txt", ".html", ".htm", ".pdf", ".docx"})

_ODD_SPACES = re.compile(r"[^\S\n]")  # any whitespace but a newline: tabs, NBSP, U+3000 ...
_LINE_BREAKS = re.compile(r"\r\n?|[\x0b\x0c\x85\u2028\u2029]")
_INVISIBLE = re.compile(r"[\ufeff\u200b]")
_TRAILING_SPACES = re.compile(r" +$", re.MULTILINE)
_BLANK_RUNS = re.compile(r"\n{3,}")
_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?)^---[ \t]*$\n?", re.DOTALL | re.MULTILINE)
_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6}) +(.*?)(?: +#+)? *$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


class _Part(NamedTuple):
    """A piece of a document before assembly: its heading path, text and page."""

    heading_path: tuple[str, ...]
    text: str
    page: int | None = None


class _Parsed(NamedTuple):
    text: str
    sections: tuple[Section, ...]
    metadata: dict[str, Any]


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


def _walk(folder: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
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


def normalize_text(text: str) -> str:
    """NFC, ``\\n`` line breaks, plain spaces, no trailing spaces, at most one blank line, stripped."""
    text = unicodedata.normalize("NFC", text)
    text = _LINE_BREAKS.sub("\n", text)
    text = _INVISIBLE.sub("", text)
    text = _ODD_SPACES.sub(" ", text)
    text = _TRAILING_SPACES.sub("", text)
    return _BLANK_RUNS.sub("\n\n", text).strip()


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


def _decode_text(raw: bytes) -> str:
    if b"\x00" in raw:
        raise LoaderError("binary file (contains NUL bytes)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise LoaderError("binary file (not UTF-8 text)") from None


def _assemble(parts: Sequence[_Part]) -> tuple[str, tuple[Section, ...]]:
    """Join normalized parts with blank lines; each non-empty part is a section."""
    texts, sections, offset = [], [], 0
    for part in parts:
        text = normalize_text(part.text)
        if not text:
            continue
        offset += 2 if texts else 0  # the "\n\n" joining this part to the previous one
        texts.append(text)
        sections.append(Section(part.heading_path, offset, offset + len(text), part.page))
        offset += len(text)
    return "\n\n".join(texts), _tiled(sections, offset)


def _tiled(sections: Sequence[Section], text_length: int) -> tuple[Section, ...]:
    """Stretch each section to the next one's start so that they cover the text."""
    ends = [s.start for s in sections[1:]] + [text_length]
    return tuple(Section(s.heading_path, s.start, end, s.page) for s, end in zip(sections, ends))


# --- Markdown and plain text ------------------------------------------------


def _parse_text(raw: bytes) -> _Parsed:
    # Heading path () rather than the file stem: no invented headings; the
    # source path travels in every chunk's metadata anyway.
    text = normalize_text(_decode_text(raw))
    return _Parsed(text, (Section((), 0, len(text)),) if text else (), {})


def _parse_markdown(raw: bytes) -> _Parsed:
    text = _LINE_BREAKS.sub("\n", _decode_text(raw))
    metadata, body = _split_front_matter(text)
    body = normalize_text(body)
    title = metadata.get("title")
    preamble_path = (str(title).strip(),) if title not in (None, "") else ()
    return _Parsed(body, _markdown_sections(body, preamble_path), metadata)


def _split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    match = _FRONT_MATTER.match(text)
    if match is None:
        return {}, text
    try:
        loaded = yaml.safe_load(match.group(1)) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""  # +2: 1-based, after the '---'
        raise LoaderError(f"malformed YAML front matter{where}: {getattr(exc, 'problem', None) or exc}") from exc
    if not isinstance(loaded, dict):
        raise LoaderError("front matter is not a mapping of keys to values")
    return _normalized_front_matter(loaded), text[match.end() :]


def _normalized_front_matter(loaded: dict[Any, Any]) -> dict[str, Any]:
    """JSON-safe values; ``module`` a string, point lists lists of strings; nulls dropped for those."""
    metadata = {str(k): _json_value(v) for k, v in loaded.items()}
    if metadata.get("module") is not None:
        if isinstance(metadata["module"], (list, dict)):
            raise LoaderError("front matter 'module' must be a single value")
        metadata["module"] = str(metadata["module"]).strip()
    for key in ("module", "skill_points", "score_points"):
        if key in metadata and metadata[key] is None:
            del metadata[key]
    for key in ("skill_points", "score_points"):
        if key in metadata:
            values = metadata[key] if isinstance(metadata[key], list) else [metadata[key]]
            metadata[key] = [str(v).strip() for v in values if v is not None and str(v).strip()]
    return metadata


def _json_value(value: Any) -> Any:
    if isinstance(value, (dt.date, dt.time)):  # dt.datetime is a dt.date
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_value(v) for v in value]
    if isinstance(value, bytes):  # YAML !!binary
        return value.decode("utf-8", errors="replace")
    return value


def _markdown_sections(body: str, preamble_path: tuple[str, ...]) -> tuple[Section, ...]:
    if not body:
        return ()
    headings = list(_atx_headings(body))
    sections, stack = [], []  # stack: (level, title) of the enclosing headings
    if not headings or headings[0][0] > 0:
        sections.append(Section(preamble_path, 0, 0))
    for start, level, title in headings:
        sections.append(Section(_push_heading(stack, level, title), start, start))
    return _tiled(sections, len(body))


def _atx_headings(body: str) -> Iterator[tuple[int, int, str]]:
    """(offset, level, title) of each ATX heading outside fenced code blocks."""
    fence, offset = "", 0
    for line in body.split("\n"):
        opener = _FENCE.match(line)
        if fence and opener and opener.group(1)[0] == fence[0] and len(opener.group(1)) >= len(fence):
            fence = ""
        elif not fence and opener:
            fence = opener.group(1)
        elif not fence and (heading := _ATX_HEADING.match(line)) and heading.group(2).strip():
            yield offset, len(heading.group(1)), heading.group(2).strip()
        offset += len(line) + 1


def _push_heading(stack: list[tuple[int, str]], level: int, title: str) -> tuple[str, ...]:
    """Enter a heading: close the siblings and deeper ones, return the new heading path."""
    while stack and stack[-1][0] >= level:
        stack.pop()
    stack.append((level, title))
    return tuple(t for _, t in stack)


def _heading_parts(lines: Iterable[tuple[int | None, str]], preamble_path: tuple[str, ...]) -> list[_Part]:
    """Group (heading level or None, line) pairs into parts, one per heading."""
    groups: list[tuple[tuple[str, ...], list[str]]] = [(preamble_path, [])]
    stack: list[tuple[int, str]] = []
    for level, line in lines:
        if level is None:
            groups[-1][1].append(line)
        elif line.strip():
            groups.append((_push_heading(stack, level, line.strip()), [line.strip()]))
    return [_Part(path, "\n".join(body)) for path, body in groups]


# --- HTML -------------------------------------------------------------------

_HTML_DROPPED = frozenset({"script", "style", "noscript", "template", "head", "title", "iframe", "svg"})
_HTML_HEADINGS = {"h1": 1, "h2": 2, "h3": 3}
_HTML_PARAGRAPHS = frozenset(
    {"p", "pre", "blockquote", "table", "ul", "ol", "dl", "h4", "h5", "h6", "hr", "section", "article",
     "header", "footer", "figure", "main", "aside", "nav", "address", "details", "form", "fieldset"}
)
_HTML_LINES = frozenset({"div", "li", "tr", "td", "th", "dt", "dd", "caption", "figcaption", "summary", "br", "body"})
# Private-use marks stand for breaks while rendering, so that the whitespace
# around a break (source indentation) can be dropped in one substitution.
_LINE_MARK, _PARAGRAPH_MARK, _HEADING_MARK = "\ue000", "\ue001", "\ue002"
_BREAK_MARKS = _LINE_MARK + _PARAGRAPH_MARK
_BREAKS = re.compile(f"[ {_BREAK_MARKS}]*[{_BREAK_MARKS}][ {_BREAK_MARKS}]*")
_MARKS_IN_SOURCE = re.compile("[\ue000-\ue002]")  # removed from the page text so they cannot be misread
_WHITESPACE_RUN = re.compile(r"\s+")


def _parse_html(raw: bytes) -> _Parsed:
    if b"\x00" in raw:
        raise LoaderError("binary file (contains NUL bytes)")
    soup = BeautifulSoup(raw, "html.parser")  # detects the encoding from <meta charset> or the bytes
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    rendered: list[str] = []
    try:
        _render_html(soup, rendered, in_pre=False)
    except RecursionError:
        raise LoaderError("HTML nested too deeply") from None
    text = _BREAKS.sub(lambda m: "\n\n" if _PARAGRAPH_MARK in m.group() else "\n", "".join(rendered))
    lines = (_html_line(line) for line in text.split("\n"))
    text, sections = _assemble(_heading_parts(lines, (title,) if title else ()))
    return _Parsed(text, sections, {"title": title} if title else {})


def _html_line(line: str) -> tuple[int | None, str]:
    if line.startswith(_HEADING_MARK):
        return int(line[1]), line[2:]
    return None, line


def _render_html(node: Tag, out: list[str], *, in_pre: bool) -> None:
    """Append the visible text of ``node``, with marks where blocks break lines."""
    for child in node.children:
        if isinstance(child, Tag):
            _render_tag(child, out, in_pre=in_pre)
        elif type(child) is NavigableString:  # subclasses are comments, doctypes, CDATA
            visible = _MARKS_IN_SOURCE.sub("", child)
            out.append(visible if in_pre else _WHITESPACE_RUN.sub(" ", visible))


def _render_tag(tag: Tag, out: list[str], *, in_pre: bool) -> None:
    if tag.name in _HTML_DROPPED:
        return
    if tag.name in _HTML_HEADINGS:
        title = " ".join(tag.get_text(" ").split())
        out.append(f"{_PARAGRAPH_MARK}{_HEADING_MARK}{_HTML_HEADINGS[tag.name]}{title}{_PARAGRAPH_MARK}")
        return
    mark = _PARAGRAPH_MARK if tag.name in _HTML_PARAGRAPHS else _LINE_MARK if tag.name in _HTML_LINES else ""
    out.append(mark)
    _render_html(tag, out, in_pre=in_pre or tag.name == "pre")
    out.append(mark)


# --- PDF --------------------------------------------------------------------


def _parse_pdf(raw: bytes) -> _Parsed:
    try:
        reader = PdfReader(io.BytesIO(raw))
        if reader.is_encrypted and not reader.decrypt(""):
            raise LoaderError("corrupt PDF: encrypted (needs a password)")
        info = reader.metadata
        title, author = (info.title, info.author) if info is not None else (None, None)
        pages = [page.extract_text() or "" for page in reader.pages]
    except LoaderError:
        raise
    except Exception as exc:  # pypdf raises many types (PdfReadError, KeyError, ValueError ...) on damage
        raise LoaderError(f"corrupt PDF: {_reason(exc)}") from exc
    title, author = _clean(title), _clean(author)
    blank = [n for n, page in enumerate(pages, start=1) if not page.strip()]
    if blank:
        logger.debug("PDF pages without extractable text, skipped: %s", blank)
    prefix = (title,) if title else ()
    text, sections = _assemble([_Part((*prefix, f"p. {n}"), page, n) for n, page in enumerate(pages, start=1)])
    if not text:
        raise LoaderError("no text extracted (scanned PDF?)")
    metadata = {"title": title, "author": author, "pages": len(pages)}
    return _Parsed(text, sections, {k: v for k, v in metadata.items() if v})


# --- DOCX -------------------------------------------------------------------

_DOCX_HEADING = re.compile(r"heading ([1-9])", re.IGNORECASE)


def _parse_docx(raw: bytes) -> _Parsed:
    try:
        document = docx.Document(io.BytesIO(raw))
        title, author = document.core_properties.title, document.core_properties.author
        lines = list(_docx_lines(document))
    except Exception as exc:  # python-docx raises zip, XML and KeyError types on damage
        raise LoaderError(f"corrupt DOCX: {_reason(exc)}") from exc
    title, author = _clean(title), _clean(author)
    text, sections = _assemble(_heading_parts(lines, (title,) if title else ()))
    metadata = {"title": title, "author": author}
    return _Parsed(text, sections, {k: v for k, v in metadata.items() if v})


def _docx_lines(document: Any) -> Iterator[tuple[int | None, str]]:
    """(heading level or None, text) of the body's paragraphs and table cells, in order."""
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            yield _docx_heading_level(block), block.text
        else:
            yield from ((None, line) for line in _table_lines(block))


def _docx_heading_level(paragraph: Paragraph) -> int | None:
    name = (paragraph.style.name if paragraph.style is not None else None) or ""
    if name.lower() == "title":
        return 0  # above "Heading 1", so headings nest under the title
    match = _DOCX_HEADING.fullmatch(name)
    return int(match.group(1)) if match else None


def _table_lines(table: Table) -> Iterator[str]:
    # A merged cell is listed once per grid column it spans; its XML element
    # identifies it (the set keeps the lxml proxies alive, so identity holds).
    seen: set[Any] = set()
    for row in table.rows:
        for cell in row.cells:
            if cell._tc in seen:
                continue
            seen.add(cell._tc)
            for block in cell.iter_inner_content():
                if isinstance(block, Paragraph):
                    yield block.text
                else:
                    yield from _table_lines(block)


def _clean(value: Any) -> str:
    return " ".join(str(value).split()) if value else ""


def _reason(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


_PARSERS: dict[str, Callable[[bytes], _Parsed]] = {
    ".md": _parse_markdown,
    ".markdown": _parse_markdown,
    ".txt": _parse_text,
    ".html": _parse_html,
    ".htm": _parse_html,
    ".pdf": _parse_pdf,
    ".docx": _parse_docx,
}
