"""Text normalization and section assembly shared by every format loader.

A loader produces ``Part``s (heading path, text, page) or heading-tagged lines;
``assemble`` normalizes and joins them, and ``tiled`` stretches the resulting
``Section`` spans so that they cover the whole text.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from strata.errors import LoaderError
from strata.indexing.loaders._encoding import guess_encoding
from strata.types import Section

_ODD_SPACES = re.compile(r"[^\S\n]")  # any whitespace but a newline: tabs, NBSP, U+3000 ...
LINE_BREAKS = re.compile(r"\r\n?|[\x0b\x0c\x85\u2028\u2029]")
_INVISIBLE = re.compile(r"[\ufeff\u200b]")
# Only a run's first space may start a match: " +$" alone would rescan the rest of a run from each of its spaces
# (quadratic: 16k spaces before a letter took 1.9 s).
_TRAILING_SPACES = re.compile(r"(?<! ) ++$", re.MULTILINE)
_BLANK_RUNS = re.compile(r"\n{3,}+")


class Part(NamedTuple):
    """A piece of a document before assembly: its heading path, text and page."""

    heading_path: tuple[str, ...]
    text: str
    page: int | None = None


class Parsed(NamedTuple):
    """What a format loader returns: normalized text, the sections tiling it, metadata, and notes.

    A note is something a user should know that does not fail the file, on one line: what it names and strata
    did not index (an include or snippet of another file, which no loader reads), or markup the parser refused
    or found left open (a docutils error, an admonition with no body). ``load_document`` logs each one as a
    warning naming the file and keeps them on the ``SourceDocument`` (``SourceDocument.notes``).
    """

    text: str
    sections: tuple[Section, ...]
    metadata: dict[str, Any]
    notes: tuple[str, ...] = ()


def normalize_text(text: str) -> str:
    """NFC, ``\\n`` line breaks, plain spaces, no trailing spaces, at most one blank line, stripped."""
    text = unicodedata.normalize("NFC", text)
    text = LINE_BREAKS.sub("\n", text)
    text = _INVISIBLE.sub("", text)
    text = _ODD_SPACES.sub(" ", text)
    text = _TRAILING_SPACES.sub("", text)
    return _BLANK_RUNS.sub("\n\n", text).strip()


def decode_text(raw: bytes) -> str:
    """UTF-8 (with or without a BOM) to ``str``; ``LoaderError`` for binary content or another encoding (named)."""
    if b"\x00" in raw:
        raise LoaderError("binary file (contains NUL bytes)")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    encoding = guess_encoding(raw)
    if encoding is None:
        raise LoaderError("binary file (not UTF-8 text)")
    iconv = encoding.split(" ", 1)[0]
    raise LoaderError(f"not UTF-8 text: it looks like {encoding}; convert it with iconv -f {iconv} -t UTF-8")


def assemble(parts: Sequence[Part]) -> tuple[str, tuple[Section, ...]]:
    """Join normalized parts with blank lines; each non-empty part is a section."""
    texts: list[str] = []
    sections: list[Section] = []
    offset = 0
    for part in parts:
        text = normalize_text(part.text)
        if not text:
            continue
        offset += 2 if texts else 0  # the "\n\n" joining this part to the previous one
        texts.append(text)
        sections.append(Section(part.heading_path, offset, offset + len(text), part.page))
        offset += len(text)
    return "\n\n".join(texts), tiled(sections, offset)


def tiled(sections: Sequence[Section], text_length: int) -> tuple[Section, ...]:
    """Stretch each section to the next one's start so that they cover the text."""
    ends = [s.start for s in sections[1:]] + [text_length]
    return tuple(Section(s.heading_path, s.start, end, s.page) for s, end in zip(sections, ends))


def push_heading(stack: list[tuple[int, str]], level: int, title: str) -> tuple[str, ...]:
    """Enter a heading: close the siblings and deeper ones, return the new heading path."""
    while stack and stack[-1][0] >= level:
        stack.pop()
    stack.append((level, title))
    return tuple(t for _, t in stack)


def heading_parts(lines: Iterable[tuple[int | None, str]], preamble_path: tuple[str, ...]) -> list[Part]:
    """Group (heading level or None, line) pairs into parts, one per heading."""
    groups: list[tuple[tuple[str, ...], list[str]]] = [(preamble_path, [])]
    stack: list[tuple[int, str]] = []
    for level, line in lines:
        if level is None:
            groups[-1][1].append(line)
        elif line.strip():
            groups.append((push_heading(stack, level, line.strip()), [line.strip()]))
    return [Part(path, "\n".join(body)) for path, body in groups]


def clean(value: Any) -> str:
    """A document property (title, author) as one line with single spaces; ``""`` when unset."""
    return " ".join(str(value).split()) if value else ""


def reason(exc: BaseException) -> str:
    """The first line of an exception's message, or its type name when it has none."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
