"""How much one source file may cost a loader: bytes once decompressed, elements, its text's size, parse time
and memory.

A small file can be expensive: a 51 KB .docx of two million empty paragraphs,
a zip member that inflates to gigabytes, an HTML page of nothing but tags.
Every loader checks what it can count before the expensive step and fails the
file with one line naming the setting to raise (``STRATA_INDEXING__...``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from strata.errors import LoaderError

if TYPE_CHECKING:
    from strata.config import IndexingSettings


@dataclass(frozen=True)
class LoaderLimits:
    """The bounds of one file's load; the defaults are ``IndexingSettings``'s."""

    max_document_bytes: int = 50 * 1024 * 1024
    max_decompressed_bytes: int = 256 * 1024 * 1024
    max_elements: int = 100_000
    parse_timeout_s: float = 60.0
    parse_max_memory_bytes: int = 1024 * 1024 * 1024
    parse_workers: int = 2

    @classmethod
    def from_settings(cls, settings: IndexingSettings) -> LoaderLimits:
        return cls(
            max_document_bytes=settings.max_document_bytes,
            max_decompressed_bytes=settings.max_decompressed_bytes,
            max_elements=settings.max_elements,
            parse_timeout_s=settings.parse_timeout_s,
            parse_max_memory_bytes=settings.parse_max_memory_bytes,
            parse_workers=settings.parse_workers,
        )

    def check_document(self, text: str) -> None:
        """``LoaderError`` when the UTF-8 of a parsed document's ``text`` is over ``max_document_bytes``."""
        size = utf8_size(text)
        if size > self.max_document_bytes:
            limit = self.max_document_bytes
            variable = setting("max_document_bytes")
            raise LoaderError(f"the document is {size:,} bytes, over the limit of {limit:,} ({variable})")

    def check_text_file(self, size: int) -> None:
        """``LoaderError`` when a .txt or .md file of ``size`` bytes is too large for its text to be indexed.

        Such a file's text is its bytes decoded as UTF-8 (``decode_text`` takes no other encoding), a BOM
        of 3 bytes aside, so it is as large as the file until normalization, and normalization does not halve
        text: CRLF becoming LF saves one byte a line, NFC composing an accent written apart takes 3 bytes to
        2 (conjoining Hangul jamo, rare, 9 to 3). Only padding goes further: trailing spaces, empty lines,
        zero-width characters, and in Markdown the front matter (at most 64 KiB). So a file over
        ``TEXT_FILE_FACTOR`` times ``max_document_bytes`` is refused unread: its text could fit only if more
        than half of the file were padding.
        """
        if size > TEXT_FILE_FACTOR * self.max_document_bytes:
            limit = self.max_document_bytes
            raise LoaderError(
                f"the file is {size:,} bytes, more than {TEXT_FILE_FACTOR} times the limit of {limit:,} on its text "
                f"({setting('max_document_bytes')})"
            )

    def check_elements(self, what: str, count: int) -> None:
        """``LoaderError`` when ``count`` ``what`` ("docx paragraphs") are over ``max_elements``."""
        if count > self.max_elements:
            raise LoaderError(f"{_counted(what, count)}, more than {setting('max_elements')} ({self.max_elements:,})")

    def check_bytes(self, what: str, size: int) -> None:
        """``LoaderError`` when ``what`` ("docx decompresses to") ``size`` bytes is over ``max_decompressed_bytes``."""
        if size > self.max_decompressed_bytes:
            limit = self.max_decompressed_bytes
            raise LoaderError(f"{what} {size:,} bytes, more than {setting('max_decompressed_bytes')} ({limit:,})")


TEXT_FILE_FACTOR = 2  # see LoaderLimits.check_text_file
_SLICE_CHARS = 1024 * 1024


def utf8_size(text: str) -> int:
    """``len(text.encode("utf-8"))`` without a second copy of the whole text: a megabyte of characters at a time."""
    if text.isascii():
        return len(text)
    # surrogatepass: a lone surrogate (a PDF's broken text) is measured as the 3 bytes it takes, not an error here
    return sum(
        len(text[i : i + _SLICE_CHARS].encode("utf-8", "surrogatepass")) for i in range(0, len(text), _SLICE_CHARS)
    )


def setting(field: str) -> str:
    """The variable that sets ``field`` of the indexing settings."""
    return f"STRATA_INDEXING__{field.upper()}"


def out_of_memory(limits: LoaderLimits) -> str:
    """Why a file failed whose parse needed more than ``parse_max_memory_bytes``."""
    limit = limits.parse_max_memory_bytes
    return f"parsing needed more memory than {setting('parse_max_memory_bytes')} ({limit:,} bytes)"


def _counted(what: str, count: int) -> str:
    kind, _, noun = what.partition(" ")  # "docx paragraphs" -> "docx has 2,000,000 paragraphs"
    return f"{kind} has {count:,} {noun}"
