"""Adjacent-chunk joining (pure): consecutive hit leaves of one document become one passage.

The ``adjacent`` strategy's alternative to auto-merge: instead of replacing
hit leaves by their whole parent, a run of leaves with consecutive ordinals of
the same document version and level is joined into one passage spanning just
those leaves. Ordinals count within a level over the whole document in
document order (see ``strata.indexing.chunking``), so ``ordinal + 1`` is the
next leaf even across parent boundaries; leaves of different documents,
versions or knowledge bases are never joined.

Text: a leaf's text is ``doc.text[char_start:char_end]``. When the next leaf
starts before the previous one ends (chunk overlap) only its part after that
end is appended; when it starts later, the whitespace between them (which
the leaves do not store) is rendered as one newline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from strata.rag.candidates import Candidate
from strata.types import Chunk

GAP = "\n"
_HEADING_PATHS_SEPARATOR = " | "

_DocKey = tuple[str, str, int, int]


def merge_adjacent_chunks(candidates: Sequence[Candidate]) -> list[Candidate]:
    """``candidates`` with every maximal run of consecutive leaves joined into one passage.

    A joined passage takes the position of its first member in the list, the
    best member score and that member's trace (``score_stage="adjacent"``),
    and lists its leaf ids in document order in ``merged_from``. Candidates
    without neighbours are returned unchanged; a repeated chunk id counts once.
    Each level is joined on its own: a list that mixes a parent with its own
    leaves should go through ``merge.collapse`` first.
    """
    unique: dict[str, Candidate] = {}
    for cand in candidates:
        unique.setdefault(cand.chunk_id, cand)
    position = {chunk_id: i for i, chunk_id in enumerate(unique)}
    placed = [(min(position[c.chunk_id] for c in run), _passage(run)) for run in _runs(list(unique.values()))]
    return [passage for _, passage in sorted(placed, key=lambda p: p[0])]


def join_chunks(chunks: Sequence[Chunk]) -> Chunk:
    """One chunk covering consecutive ``chunks`` of one document version (in document order)."""
    first, last = chunks[0], chunks[-1]
    if len(chunks) == 1:
        return first
    paths = list(dict.fromkeys(c.heading_path for c in chunks))
    parents = {c.parent_id for c in chunks}
    roots = {c.root_id for c in chunks}
    joined_id = f"{first.chunk_id}..{last.chunk_id}"
    return replace(
        first,
        chunk_id=joined_id,
        parent_id=first.parent_id if len(parents) == 1 else None,
        root_id=first.root_id if len(roots) == 1 else joined_id,
        text=_joined_text(chunks),
        heading_path=_HEADING_PATHS_SEPARATOR.join(paths),
        char_end=max(c.char_end for c in chunks),
        child_count=0,
    )


def _joined_text(chunks: Sequence[Chunk]) -> str:
    parts = [chunks[0].text]
    end = chunks[0].char_end
    for chunk in chunks[1:]:
        if chunk.char_start >= end:
            parts.append(GAP if chunk.char_start > end else "")
            parts.append(chunk.text)
        elif chunk.char_end > end:
            parts.append(chunk.text[end - chunk.char_start :])
        end = max(end, chunk.char_end)
    return "".join(parts)


def _runs(candidates: Sequence[Candidate]) -> list[list[Candidate]]:
    """Maximal runs of consecutive ordinals per (kb, doc, version, level), each in document order."""
    groups: dict[_DocKey, list[Candidate]] = {}
    for cand in candidates:
        chunk = cand.chunk
        groups.setdefault((chunk.kb_id, chunk.doc_id, chunk.version, chunk.level), []).append(cand)
    runs: list[list[Candidate]] = []
    for members in groups.values():
        members = sorted(members, key=lambda c: c.chunk.ordinal)
        runs.append([members[0]])
        for cand in members[1:]:
            if cand.chunk.ordinal == runs[-1][-1].chunk.ordinal + 1:
                runs[-1].append(cand)
            else:
                runs.append([cand])
    return runs


def _passage(run: list[Candidate]) -> Candidate:
    if len(run) == 1:
        return run[0]
    best = max(run, key=lambda c: c.score)  # the first of equals in document order
    return Candidate(
        chunk=join_chunks([c.chunk for c in run]),
        score=best.score,
        trace=replace(best.trace, score_stage="adjacent"),
        merged_from=tuple(leaf for c in run for leaf in (c.merged_from or (c.chunk_id,))),
    )
