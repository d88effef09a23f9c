"""DOCX loader: body paragraphs and table cells, split into sections at headings.

Paragraphs styled "Title" or "Heading n" start sections; the title nests above
"Heading 1".

A .docx is a zip of XML, so a few KB can stand for gigabytes or millions of
paragraphs. Before python-docx builds the document, the members' declared
sizes (``zipfile`` never inflates a member past its declared size) and the
main part's paragraphs and table cells (counted while streaming it) are held
to ``LoaderLimits``. The walk itself is linear: python-docx's
``Paragraph.style`` reads every style of the document for each paragraph, and
``_Row.cells`` lays out the whole table for each row.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Callable, Iterator
from typing import IO, Any

import docx
from docx.enum.style import WD_STYLE_TYPE
from docx.oxml.simpletypes import ST_Merge
from docx.table import Table, _Cell
from docx.text.paragraph import Paragraph
from lxml import etree

from strata.errors import LoaderError
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.loaders._text import Parsed, assemble, clean, heading_parts, reason

_DOCX_HEADING = re.compile(r"heading ([1-9])", re.IGNORECASE)
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_OFFICE_DOCUMENT = "/officeDocument"  # the end of the package relationship type naming the main part
_RELATIONSHIP = "{http://schemas.openxmlformats.org/package/2006/relationships}Relationship"


def parse_docx(raw: bytes, limits: LoaderLimits = LoaderLimits()) -> Parsed:
    """DOCX: one section per heading paragraph; core title and author as metadata."""
    try:
        _check_package(raw, limits)
        document = docx.Document(io.BytesIO(raw))
        title, author = document.core_properties.title, document.core_properties.author
        lines = list(_docx_lines(document))
    except LoaderError:
        raise
    except Exception as exc:  # python-docx raises zip, XML and KeyError types on damage
        raise LoaderError(f"corrupt DOCX: {reason(exc)}") from exc
    title, author = clean(title), clean(author)
    text, sections = assemble(heading_parts(lines, (title,) if title else ()))
    metadata = {"title": title, "author": author}
    return Parsed(text, sections, {k: v for k, v in metadata.items() if v})


def _check_package(raw: bytes, limits: LoaderLimits) -> None:
    """``LoaderError`` when the members inflate past ``max_decompressed_bytes`` or the body has too many elements."""
    with zipfile.ZipFile(io.BytesIO(raw)) as package:
        limits.check_bytes("docx decompresses to", sum(info.file_size for info in package.infolist()))
        main = _main_part(package)
        if main not in package.namelist():
            return  # python-docx names what is missing
        with package.open(main) as body:
            paragraphs, cells = _count_blocks(body)
    limits.check_elements("docx paragraphs", paragraphs)
    limits.check_elements("docx table cells", cells)


def _main_part(package: zipfile.ZipFile) -> str:
    try:
        rels = etree.fromstring(package.read("_rels/.rels"), _SAFE_XML)
    except (KeyError, etree.XMLSyntaxError):
        return "word/document.xml"
    for rel in rels.iter(_RELATIONSHIP):
        if rel.get("Type", "").endswith(_OFFICE_DOCUMENT):
            return rel.get("Target", "").lstrip("/")
    return "word/document.xml"


def _count_blocks(body: IO[bytes]) -> tuple[int, int]:
    """(paragraphs, table cells) of the main part, streamed through a parser that builds no tree."""
    counter = _BlockCounter()
    parser = etree.XMLParser(target=counter, resolve_entities=False, no_network=True)
    while chunk := body.read(_CHUNK):
        parser.feed(chunk)
    parser.close()
    return counter.paragraphs, counter.cells


class _BlockCounter:
    """An lxml parser target: counts ``<w:p>`` and ``<w:tc>`` start tags (2M empty paragraphs: about 2 s)."""

    def __init__(self) -> None:
        self.paragraphs = self.cells = 0

    def start(self, tag: str, attrib: Any) -> None:
        if tag == _PARAGRAPH:
            self.paragraphs += 1
        elif tag == _CELL:
            self.cells += 1

    def close(self) -> None:
        return None


_SAFE_XML = etree.XMLParser(resolve_entities=False, no_network=True)
_CHUNK = 1024 * 1024
_PARAGRAPH, _CELL = f"{_W}p", f"{_W}tc"


def _docx_lines(document: Any) -> Iterator[tuple[int | None, str]]:
    """(heading level or None, text) of the body's paragraphs and table cells, in order."""
    heading_level = _heading_levels(document)
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            yield heading_level(block), block.text
        else:
            yield from ((None, line) for line in _table_lines(block))


def _heading_levels(document: Any) -> Callable[[Paragraph], int | None]:
    """A paragraph's heading level from its style id, each paragraph style's name read once."""
    styles = document.styles
    levels = {
        style.style_id: _style_level(style.name)
        for style in styles
        if style.type == WD_STYLE_TYPE.PARAGRAPH and style.style_id is not None
    }
    default = styles.default(WD_STYLE_TYPE.PARAGRAPH)  # what python-docx gives a paragraph of an unknown style
    fallback = _style_level(default.name) if default is not None else None
    return lambda paragraph: levels.get(paragraph._p.style, fallback)


def _style_level(name: str | None) -> int | None:
    if (name or "").lower() == "title":
        return 0  # above "Heading 1", so headings nest under the title
    match = _DOCX_HEADING.fullmatch(name or "")
    return int(match.group(1)) if match else None


def _table_lines(table: Table) -> Iterator[str]:
    # Each <w:tc> once, in row order: a cell spanning columns is one element, and a vertically merged
    # one ("continue") belongs to the cell above, whose text was given there.
    for row in table._tbl.tr_lst:
        for tc in row.tc_lst:
            if tc.vMerge == ST_Merge.CONTINUE:
                continue
            for block in _Cell(tc, table).iter_inner_content():
                if isinstance(block, Paragraph):
                    yield block.text
                else:
                    yield from _table_lines(block)
