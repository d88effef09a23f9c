"""Evidence formatted for an LLM prompt or an agent tool's output."""

from __future__ import annotations

from collections.abc import Sequence

from strata.rag.budget import cut_to
from strata.types import RetrievedDocument


def _label(doc: RetrievedDocument) -> str:
    meta = doc.metadata
    where = str(meta.get("source") or meta.get("doc_id") or "unknown")
    heading = str(meta.get("heading_path") or "")
    return f"{where} — {heading}" if heading else where


def format_for_context(docs: Sequence[RetrievedDocument], max_chars: int = 6000) -> str:
    """Numbered evidence blocks ``[n] source — heading path`` for a prompt, at most ``max_chars`` in all.

    The same rule as a retrieval's ``max_chars`` (``strata.rag.budget``), with each block's label counted:
    whole documents in rank order; the first that does not fit is cut to the part that answered and marked
    with "…"; later ones are left out. A result retrieved with ``max_chars`` N formats whole within N plus
    its labels.
    """
    blocks: list[str] = []
    used = 0
    for n, doc in enumerate(docs, start=1):
        head = f"[{n}] {_label(doc)}\n"
        room = max_chars - used - (2 if blocks else 0) - len(head)
        content = doc.content.strip()
        if len(content) <= room:
            blocks.append(head + content)
            used += len(blocks[-1]) + (2 if len(blocks) > 1 else 0)
            continue
        piece = cut_to(doc, room - 1)
        if piece is not None:
            blocks.append(head + piece.content + "…")
        break
    return "\n\n".join(blocks)


def format_for_tool_output(docs: Sequence[RetrievedDocument], max_chunks: int = 5) -> str:
    """A compact listing for an agent tool: rank, score, level, source and text."""
    if not docs:
        return "No evidence found."
    lines = []
    for n, doc in enumerate(docs[:max_chunks], start=1):
        level = doc.metadata.get("level", "?")
        lines.append(f"{n}. [score {doc.score:.4f}, L{level}] {_label(doc)}\n   {doc.content.strip()}")
    if len(docs) > max_chunks:
        lines.append(f"({len(docs) - max_chunks} more not shown)")
    return "\n".join(lines)
