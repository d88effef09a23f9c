"""The hierarchical chunker: a ``SourceDocument`` into L1 ⊃ L2 ⊃ L3 chunks.

Pure: no I/O. Structure first, then size:

1. The document's sections become regions. A region that holds nothing but its
   heading line is joined to the following region (and takes its heading path),
   so a bare ``# Title`` never becomes a chunk of its own.
2. Each region is packed into L1 spans, each L1 into L2 spans, each L2 into L3
   spans, by the same sentence-aware greedy packing (``_pack``): sentence units
   are added to a chunk while its span stays within the level's maximum; a
   unit longer than the maximum is cut (after a comma or space late in the
   window when there is one, else hard).

Every span starts and ends on a non-whitespace character and
``chunk.text == doc.text[chunk.char_start:chunk.char_end]``. Without overlap,
siblings are separated by whitespace only, so a parent's text is its children's
texts joined by the original gaps; a parent that fits in one child still gets
exactly one child with the same span. With ``l{n}_overlap > 0`` a sibling may
start before the previous one ends (see ``_overlap_start``).

``chunk_document`` returns the L1 chunks in document order, then the L2s, then
the L3s. ``ordinal`` counts within a level in tree order (parent by parent),
which is document order.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata.config import ChunkingSettings
from strata.types import Chunk, Section, SourceDocument

Span = tuple[int, int]

# Part of every chunking signature (``indexing.pipeline.chunking_signature``): raised whenever this module
# would cut the same text and settings differently, so that indexed documents are chunked again.
# 2: chunks end before a block (paragraph, code block, table, definition) that would not fit in them whole.
CHUNKER_REVISION = 2

# A sentence ends after CJK terminal punctuation, after ASCII terminal
# punctuation followed by whitespace or the end, and at every newline (a heading
# or list item is a unit of its own). Closing quotes and brackets stay with the
# sentence they close.
#
# Linear on any text: an ASCII run may start a match only at its first mark
# (the lookbehind), and nothing gives characters back (possessive): else each
# mark of a long run of "." not followed by a space rescans the rest of the run
# (quadratic: 16k dots took 11.7 s). ``_sentence_units`` matches in a slice, so
# a span that starts inside a run still opens with a match as it would in the
# whole text (a lookbehind sees before ``pos``, not before a slice's start).
_CLOSERS = "”’」』）》)\\]\"'"
_SENTENCE_END = re.compile(rf"[。！？；…]++[{_CLOSERS}]*+|(?<![.!?;])[.!?;]++[{_CLOSERS}]*+(?=\s|\Z)|\n")
_SOFT_BREAKS = "，,、 "  # where an over-long sentence is preferably cut
_SOFT_WINDOW = 0.7  # ... within the last 70% of the window (never a piece under 30% of it)
# A heading line's opening and closing marks; the closing ones only from the first space of a run (see above).
_HEADING_MARKS = re.compile(r"^ {0,3}#{1,6} ++|(?<! ) ++#++ *+$")
_HEADING_SEPARATOR = " > "
_FENCES = ("```", "~~~")
_MIN_FILL = 1 / 3  # a chunk holding less goes on into the next block rather than ending short


@dataclass(frozen=True)
class _Region:
    """A span of the text that L1 chunks may not cross, with its heading path."""

    start: int
    end: int
    heading_path: tuple[str, ...]
    page: int | None


@dataclass(frozen=True)
class _L1Plan:
    """One L1 span, its L2 spans and, for each L2, its L3 spans."""

    region: _Region
    span: Span
    children: tuple[tuple[Span, tuple[Span, ...]], ...]


def chunk_id(kb_id: str, doc_id: str, version: int, level: int, ordinal: int) -> str:
    """Deterministic id: 32 hex chars of sha1 over the fields joined by ``\\x1f``.

    The unit separator does not occur in kb or document ids, so different
    field tuples cannot join to the same string.
    """
    key = "\x1f".join((kb_id, doc_id, str(version), str(level), str(ordinal)))
    return hashlib.sha1(key.encode("utf-8")).hexdigest()[:32]


def chunk_document(doc: SourceDocument, *, kb_id: str, version: int, settings: ChunkingSettings) -> list[Chunk]:
    """All L1, L2 and L3 chunks of ``doc`` (L1s first, then L2s, then L3s)."""
    return sorted(iter_chunks(doc, kb_id=kb_id, version=version, settings=settings), key=lambda c: c.level)


def iter_chunks(doc: SourceDocument, *, kb_id: str, version: int, settings: ChunkingSettings) -> Iterator[Chunk]:
    """The chunks of ``doc`` one L1 at a time: each L1, then its L2s, then their L3s, with the same ids
    and ordinals as ``chunk_document``. A caller holds one L1's chunks at a time, whatever the document's size."""
    plans = (
        _plan_l1(doc.text, region, span, settings)
        for region in _regions(doc)
        for span in _pack(doc.text, (region.start, region.end), settings.l1_max_chars, settings.l1_overlap)
    )
    return _build_chunks(doc, plans, kb_id=kb_id, version=version)


def _plan_l1(text: str, region: _Region, span: Span, settings: ChunkingSettings) -> _L1Plan:
    l2_spans = _pack(text, span, settings.l2_max_chars, settings.l2_overlap)
    children = tuple((l2, tuple(_pack(text, l2, settings.l3_max_chars, settings.l3_overlap))) for l2 in l2_spans)
    return _L1Plan(region, span, children)


# --- structure --------------------------------------------------------------


def _regions(doc: SourceDocument) -> list[_Region]:
    """Trimmed, non-empty regions in order; heading-only ones joined forward."""
    regions = [r for r in _raw_regions(doc) if r.start < r.end]
    joined: list[_Region] = []
    pending: int | None = None  # start of heading-only regions waiting to be joined
    for index, region in enumerate(regions):
        if index + 1 < len(regions) and _is_heading_only(doc.text, region):
            pending = region.start if pending is None else pending
            continue
        start = region.start if pending is None else pending
        joined.append(_Region(start, region.end, region.heading_path, region.page))
        pending = None
    return joined


def _raw_regions(doc: SourceDocument) -> list[_Region]:
    """Sections trimmed of surrounding whitespace.

    Only section starts are trusted: each section runs to the next one's start,
    and text before the first section is a region without heading, so every
    character of the text belongs to exactly one region.
    """
    sections = sorted(doc.sections, key=lambda s: s.start)
    if not sections or sections[0].start > 0:
        sections.insert(0, Section((), 0, 0))
    ends = [s.start for s in sections[1:]] + [len(doc.text)]
    return [
        _Region(*_trim(doc.text, max(s.start, 0), min(end, len(doc.text))), s.heading_path, s.page)
        for s, end in zip(sections, ends)
    ]


def _is_heading_only(text: str, region: _Region) -> bool:
    """Whether the region is a single line that is its own heading (``## Title`` or ``Title``)."""
    line = text[region.start : region.end]
    if not region.heading_path or "\n" in line:
        return False
    return _HEADING_MARKS.sub("", line).strip() == region.heading_path[-1].strip()


# --- size -------------------------------------------------------------------


def _pack(text: str, span: Span, max_chars: int, overlap: int) -> list[Span]:
    """Greedy sentence packing of ``span`` into spans of at most ``max_chars``, block by block.

    A chunk that already holds a third of ``max_chars`` ends before a block (``_blocks``) that
    would not fit in it whole: a paragraph, a code block, a table or a term with its definition
    starts a chunk of its own instead of being split across two, and a block longer than a
    chunk is split at its own lines and sentences.
    """
    units = _fit_units(text, _sentence_units(text, span), max_chars)
    block_end = _block_ends(units, _blocks(text, span))
    min_fill = int(max_chars * _MIN_FILL)
    packed: list[Span] = []
    index = 0
    while index < len(units):
        start = units[index][0] if not packed else _overlap_start(text, units, index, packed[-1], overlap, max_chars)
        last = index
        while last + 1 < len(units) and units[last + 1][1] - start <= max_chars:
            opens_block = block_end[last + 1] != block_end[last]
            if opens_block and units[last][1] - start >= min_fill and block_end[last + 1] - start > max_chars:
                break
            last += 1
        packed.append((start, units[last][1]))
        index = last + 1
    return packed


def _blocks(text: str, span: Span) -> list[Span]:
    """The blocks of ``span`` in order: runs of lines between blank lines.

    A fenced code block (```` ``` ```` or ``~~~`` to its closing fence) is one block whatever
    blank lines it holds, and lines indented by four spaces or a tab after a blank line (an
    admonition's or a list item's body, indented code) continue the block before them. One pass
    over the lines: linear in the span's length.
    """
    blocks: list[Span] = []
    block_start: int | None = None
    block_stop = span[0]
    fence = ""
    blank_before = False
    position = span[0]
    while position < span[1]:
        newline = text.find("\n", position, span[1])
        line_end = span[1] if newline < 0 else newline
        line = text[position:line_end]
        content = line.lstrip(" ")
        if fence:
            if content.startswith(fence):
                fence = ""
            block_stop = line_end
        elif not line.strip():
            blank_before = block_start is not None
        else:
            continues = blank_before and (line.startswith("    ") or line.startswith("\t"))
            if block_start is not None and blank_before and not continues:
                blocks.append((block_start, block_stop))
                block_start = None
            if block_start is None:
                block_start = position
            blank_before = False
            block_stop = line_end
            if len(line) - len(content) <= 3 and content[:3] in _FENCES:
                fence = content[:3]
        position = line_end + 1
    if block_start is not None:
        blocks.append((block_start, block_stop))
    return blocks


def _block_ends(units: Sequence[Span], blocks: Sequence[Span]) -> list[int]:
    """For each unit, the end of the block it starts in (units and blocks both in order)."""
    ends: list[int] = []
    index = 0
    for unit_start, unit_end in units:
        while index < len(blocks) and blocks[index][1] <= unit_start:
            index += 1
        ends.append(blocks[index][1] if index < len(blocks) else unit_end)
    return ends


def _sentence_units(text: str, span: Span) -> list[Span]:
    """The trimmed, non-empty sentence units of ``span``, in order."""
    units, position, offset = [], span[0], span[0]
    for match in _SENTENCE_END.finditer(text[span[0] : span[1]]):
        units.append(_trim(text, position, offset + match.end()))
        position = offset + match.end()
    units.append(_trim(text, position, span[1]))
    return [u for u in units if u[0] < u[1]]


def _fit_units(text: str, units: Sequence[Span], max_chars: int) -> list[Span]:
    fitted: list[Span] = []
    for unit in units:
        fitted.extend([unit] if unit[1] - unit[0] <= max_chars else _cut(text, unit, max_chars))
    return fitted


def _cut(text: str, unit: Span, max_chars: int) -> list[Span]:
    """Cut an over-long unit into trimmed pieces of at most ``max_chars``."""
    pieces, (start, end) = [], unit
    while end - start > max_chars:
        cut = _soft_cut(text, start, max_chars)
        pieces.append(_trim(text, start, cut))
        start = _trim(text, cut, end)[0]
    pieces.append((start, end))
    return pieces


def _soft_cut(text: str, start: int, max_chars: int) -> int:
    """Cut position after the last comma or space in the window's last 70%, else a hard cut."""
    earliest = start + max(1, max_chars - int(max_chars * _SOFT_WINDOW))
    for cut in range(start + max_chars, earliest - 1, -1):
        if text[cut - 1] in _SOFT_BREAKS:
            return cut
    return start + max_chars


def _overlap_start(text: str, units: Sequence[Span], index: int, previous: Span, overlap: int, max_chars: int) -> int:
    """Where the chunk opening with ``units[index]`` starts when it overlaps ``previous``.

    The start lies in ``[previous end - overlap, units[index] start]``, after the
    previous sibling's start, and leaves the first new unit within
    ``max_chars``. Preferred: the earliest sentence start there; else the
    earliest non-whitespace character that does not split an ASCII word (CJK
    text may start at any character); else no overlap.
    """
    own_start = units[index][0]
    lowest = max(previous[1] - overlap, previous[0] + 1, units[index][1] - max_chars)
    if overlap <= 0 or lowest >= own_start:
        return own_start
    earlier = index
    while earlier > 0 and units[earlier - 1][0] >= lowest:
        earlier -= 1
    if earlier < index:
        return units[earlier][0]
    for position in range(lowest, own_start):
        if not text[position].isspace() and not _inside_word(text, position):
            return position
    return own_start


def _inside_word(text: str, position: int) -> bool:
    before, here = text[position - 1], text[position]
    return before.isascii() and before.isalnum() and here.isascii() and here.isalnum()


def _trim(text: str, start: int, end: int) -> Span:
    """``(start, end)`` moved inwards past whitespace; empty spans collapse to ``(end, end)``."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else (end, end)


# --- records ----------------------------------------------------------------


def _build_chunks(doc: SourceDocument, plans: Iterable[_L1Plan], *, kb_id: str, version: int) -> Iterator[Chunk]:
    ordinals = [0, 0, 0]  # the next ordinal of each level, in document order
    shared = {**chunk_metadata(doc.metadata), "source": doc.source}  # sized once per document, copied per chunk

    def make(level: int, span: Span, region: _Region, parent: Chunk | None, child_count: int) -> Chunk:
        ordinal = ordinals[level - 1]
        ordinals[level - 1] += 1
        return _make_chunk(doc, kb_id, version, level, ordinal, span, region, parent, child_count, shared)

    for plan in plans:
        l1 = make(1, plan.span, plan.region, None, len(plan.children))
        yield l1
        for l2_span, l3_spans in plan.children:
            l2 = make(2, l2_span, plan.region, l1, len(l3_spans))
            yield l2
            for l3_span in l3_spans:
                yield make(3, l3_span, plan.region, l2, 0)


def _make_chunk(
    doc: SourceDocument,
    kb_id: str,
    version: int,
    level: int,
    ordinal: int,
    span: Span,
    region: _Region,
    parent: Chunk | None,
    child_count: int,
    shared_metadata: Mapping[str, Any],
) -> Chunk:
    own_id = chunk_id(kb_id, doc.doc_id, version, level, ordinal)
    metadata = dict(shared_metadata)
    if region.page is not None:
        metadata["page"] = region.page
    return Chunk(
        chunk_id=own_id,
        kb_id=kb_id,
        doc_id=doc.doc_id,
        version=version,
        level=level,
        parent_id=parent.chunk_id if parent else None,
        root_id=parent.root_id if parent else own_id,
        ordinal=ordinal,
        text=doc.text[span[0] : span[1]],
        heading_path=_HEADING_SEPARATOR.join(region.heading_path),
        char_start=span[0],
        char_end=span[1],
        child_count=child_count,
        metadata=metadata,
    )


# Fields every chunk carries whatever their size: the leaf's search filters read them.
_FILTER_FIELDS = frozenset({"module", "skill_points", "score_points"})
CHUNK_FIELD_MAX_BYTES = 1024


def chunk_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The document fields copied into each chunk: the filter fields and every field of at most 1 KB.

    A larger field (a 200 KB ``description``) stays on the document's version row only, instead of
    being stored once per chunk in SQL and once per leaf in Milvus.
    """
    return {k: v for k, v in metadata.items() if k in _FILTER_FIELDS or _json_bytes(v) <= CHUNK_FIELD_MAX_BYTES}


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str).encode("utf-8"))
