"""PDF loader: one section per page with extractable text, via pypdf.

Bounded by ``LoaderLimits``: the page count, each stream's decompressed output
(pypdf's own per-filter limits, lowered to ``max_decompressed_bytes`` when that
is smaller) and the text extracted so far.
"""

from __future__ import annotations

import io
import logging
from typing import Any

from pypdf import PdfReader, apply_configuration, get_configuration

from strata.errors import LoaderError
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.loaders._text import Parsed, Part, assemble, clean, reason

logger = logging.getLogger(__name__)

_OUTPUT_LIMITS = (
    "maximum_declared_stream_length",
    "array_based_stream_maximum_output_length",
    "jbig2_maximum_output_length",
    "lzw_maximum_output_length",
    "run_length_maximum_output_length",
    "zlib_maximum_output_length",
    "brotli_maximum_output_length",
)


def parse_pdf(raw: bytes, limits: LoaderLimits = LoaderLimits()) -> Parsed:
    """PDF: sections ``(title, "p. n")`` per page; title, author and page count as metadata."""
    try:
        with apply_configuration(**_stream_limits(limits)):  # type: ignore[arg-type]  # pypdf's keyword form
            title, author, pages = _read_pdf(raw, limits)
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


def _read_pdf(raw: bytes, limits: LoaderLimits) -> tuple[Any, Any, list[str]]:
    reader = PdfReader(io.BytesIO(raw))
    if reader.is_encrypted and not reader.decrypt(""):
        raise LoaderError("corrupt PDF: encrypted (needs a password)")
    info = reader.metadata
    limits.check_elements("PDF pages", len(reader.pages))
    pages, size = [], 0
    for page in reader.pages:
        pages.append(page.extract_text() or "")
        size += len(pages[-1].encode("utf-8", errors="replace"))
        limits.check_bytes("PDF text is at least", size)
    return (info.title, info.author, pages) if info is not None else (None, None, pages)


def _stream_limits(limits: LoaderLimits) -> dict[str, int]:
    current = get_configuration()
    return {name: min(getattr(current, name), limits.max_decompressed_bytes) for name in _OUTPUT_LIMITS}
