"""Small files that are expensive to load: a .docx of many empty paragraphs and a .docx zip bomb.

Both are written as raw zip members (a .docx is a zip of XML), which is cheap at any size:
python-docx would take minutes to build the first and the second cannot be built by it at all.
Shared by tests/indexing and tests/api.
"""

from __future__ import annotations

import io
import zipfile

_CONTENT_TYPES = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/>'
    '<Override PartName="/word/document.xml" '
    'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
)
_RELS = (
    '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    '<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">'
    '<Relationship Id="rId1" Target="word/document.xml" '
    'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument"/></Relationships>'
)
_DOCUMENT_OPEN = (
    b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>'
    b"<w:p><w:r><w:t>The only words of this document.</w:t></w:r></w:p>"
)
_DOCUMENT_CLOSE = b"</w:body></w:document>"


def empty_paragraphs_docx(paragraphs: int) -> bytes:
    """A .docx of one short paragraph and ``paragraphs`` empty ones (2,000,000 of them zip to about 25 KB)."""
    return _docx([_DOCUMENT_OPEN, b"<w:p/>" * paragraphs, _DOCUMENT_CLOSE])


def zip_bomb_docx(inflated_mb: int) -> bytes:
    """A valid .docx whose document.xml inflates to ``inflated_mb`` MB (spaces between two paragraphs)."""
    return _docx([_DOCUMENT_OPEN, *[b" " * 1024 * 1024] * inflated_mb, _DOCUMENT_CLOSE])


def _docx(document_xml: list[bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as package:
        package.writestr("[Content_Types].xml", _CONTENT_TYPES)
        package.writestr("_rels/.rels", _RELS)
        with package.open("word/document.xml", "w", force_zip64=True) as member:
            for piece in document_xml:
                member.write(piece)
    return out.getvalue()
