"""Evidence within a budget of characters (pure): what ``max_chars`` returns and ``format_for_context`` shows.

One rule for the library, the API and the prompt formatter: documents in rank order, each whole while it
fits; the first that does not fit is cut to the part that answered (a merged parent's hit leaves, from the
first one's start: ``metadata["hit_start"]``/``["hit_end"]``), ending at the last line or sentence end that
fits; everything after it is left out. A cut document says so (``metadata["cut"]`` true, its
``char_start``/``char_end`` the cut's offsets in the document). A piece shorter than ``MIN_PIECE`` characters
is not worth a reader's attention: the cut one is left out instead.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from strata.errors import InvalidArgumentError
from strata.types import RetrievedDocument

MIN_PIECE = 40
# where a cut may end: after a sentence's terminal punctuation or at a line's end
_PIECE_END = re.compile(r"[。！？；…]|[.!?;](?=\s)|\n")


def check_budget(max_chars: object) -> None:
    """``InvalidArgumentError`` unless ``max_chars`` is a positive integer."""
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 1:
        raise InvalidArgumentError(f"max_chars must be a positive integer, got {max_chars!r}")


def fit_to_budget(docs: Sequence[RetrievedDocument], max_chars: int) -> list[RetrievedDocument]:
    """``docs`` whose contents total at most ``max_chars`` characters, by the rule above."""
    check_budget(max_chars)
    kept: list[RetrievedDocument] = []
    room = max_chars
    for doc in docs:
        if len(doc.content) <= room:
            kept.append(doc)
            room -= len(doc.content)
            continue
        piece = cut_to(doc, room)
        if piece is not None:
            kept.append(piece)
        break
    return kept


def cut_to(doc: RetrievedDocument, room: int) -> RetrievedDocument | None:
    """The part of ``doc`` that answered, at most ``room`` characters, or None when under ``MIN_PIECE``."""
    if room < MIN_PIECE:
        return None
    text = doc.content
    offset = _int(doc.metadata.get("char_start"), 0)
    start = min(max(_int(doc.metadata.get("hit_start"), offset) - offset, 0), len(text))
    if len(text) - start < MIN_PIECE:  # the hit is at the very end: read up to it instead
        start = max(len(text) - room, 0)
    window = text[start : start + room]
    end = len(window)
    if start + room < len(text):  # the text goes on: end the piece at a sentence, a line or else a word
        end = max((m.end() for m in _PIECE_END.finditer(window)), default=0)
        if end < MIN_PIECE:
            end = window.rfind(" ") if window.rfind(" ") >= MIN_PIECE else len(window)
    head = window[:end]
    piece = head.strip()
    if len(piece) < MIN_PIECE:
        return None
    first = start + len(head) - len(head.lstrip())
    metadata = {**doc.metadata, "cut": True, "char_start": offset + first, "char_end": offset + first + len(piece)}
    return replace(doc, content=piece, metadata=metadata)


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
