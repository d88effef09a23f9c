"""DOCX loader: body paragraphs and table cells, split into sections at headings.

Paragraphs styled "Title" or "Heading n" start sections; the title nests above
"Heading 1".
"""

from __future__ import annotations

import io
import re
from typing import Any, Iterator

import docx
from docx.table import Table
from docx.text.paragraph import Paragraph

from strata.errors import LoaderError
from strata.indexing.loaders._text import Parsed, assemble, clean, heading_parts, reason

_DOCX_HEADING = re.compile(r"heading ([1-9])", re.IGNORECASE)


def parse_docx(raw: bytes) -> Parsed:
    """DOCX: one section per heading paragraph; core title and author as metadata."""
    try:
        document = docx.Document(io.BytesIO(raw))
        title, author = document.core_properties.title, document.core_properties.author
        lines = list(_docx_lines(document))
    except Exception as exc:  # python-docx raises zip, XML and KeyError types on damage
        raise LoaderError(f"corrupt DOCX: {reason(exc)}") from exc
    title, author = clean(title), clean(author)
    text, sections = assemble(heading_parts(lines, (title,) if title else ()))
    metadata = {"title": title, "author": author}
    return Parsed(text, sections, {k: v for k, v in metadata.items() if v})


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
