"""PDF loader: one section per page with extractable text, via pypdf."""

from __future__ import annotations

import io
import logging

from pypdf import PdfReader

from strata.errors import LoaderError
from strata.indexing.loaders._text import Parsed, Part, assemble, clean, reason

logger = logging.getLogger(__name__)


def parse_pdf(raw: bytes) -> Parsed:
    """PDF: sections ``(title, "p. n")`` per page; title, author and page count as metadata."""
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
        raise LoaderError(f"corrupt PDF: {reason(exc)}") from exc
    title, author = clean(title), clean(author)
    blank = [n for n, page in enumerate(pages, start=1) if not page.strip()]
    if blank:
        logger.debug("PDF pages without extractable text, skipped: %s", blank)
    prefix = (title,) if title else ()
    text, sections = assemble([Part((*prefix, f"p. {n}"), page, n) for n, page in enumerate(pages, start=1)])
    if not text:
        raise LoaderError("no text extracted (scanned PDF?)")
    metadata = {"title": title, "author": author, "pages": len(pages)}
    return Parsed(text, sections, {k: v for k, v in metadata.items() if v})
