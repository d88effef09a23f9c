"""How much one source file may cost a loader: bytes once decompressed, elements, parse time and memory.

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

    max_decompressed_bytes: int = 256 * 1024 * 1024
    max_elements: int = 100_000
    parse_timeout_s: float = 60.0
    parse_max_memory_bytes: int = 1024 * 1024 * 1024

    @classmethod
    def from_settings(cls, settings: IndexingSettings) -> LoaderLimits:
        return cls(
            max_decompressed_bytes=settings.max_decompressed_bytes, max_elements=settings.max_elements,
            parse_timeout_s=settings.parse_timeout_s, parse_max_memory_bytes=settings.parse_max_memory_bytes,
        )  # fmt: skip

    def check_elements(self, what: str, count: int) -> None:
        """``LoaderError`` when ``count`` ``what`` ("docx paragraphs") are over ``max_elements``."""
        if count > self.max_elements:
            raise LoaderError(f"{_counted(what, count)}, more than {setting('max_elements')} ({self.max_elements:,})")

    def check_bytes(self, what: str, size: int) -> None:
        """``LoaderError`` when ``what`` ("docx decompresses to") ``size`` bytes is over ``max_decompressed_bytes``."""
        if size > self.max_decompressed_bytes:
            limit = self.max_decompressed_bytes
            raise LoaderError(f"{what} {size:,} bytes, more than {setting('max_decompressed_bytes')} ({limit:,})")


def setting(field: str) -> str:
    """The variable that sets ``field`` of the indexing settings."""
    return f"STRATA_INDEXING__{field.upper()}"


def _counted(what: str, count: int) -> str:
    kind, _, noun = what.partition(" ")  # "docx paragraphs" -> "docx has 2,000,000 paragraphs"
    return f"{kind} has {count:,} {noun}"
