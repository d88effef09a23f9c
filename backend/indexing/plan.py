"""Incremental planning (pure): which documents to add, update, skip or delete."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from backend.stores.sql import ACTIVE, DocumentVersion
from backend.types import SourceDocument


@dataclass(frozen=True)
class DocumentPlan:
    """A document to write as ``version``; ``previous`` is the version it replaces."""

    doc: SourceDocument
    version: int
    previous: DocumentVersion | None


@dataclass(frozen=True)
class IndexPlan:
    to_write: tuple[DocumentPlan, ...]
    unchanged: tuple[SourceDocument, ...]
    to_delete: tuple[DocumentVersion, ...]


def plan_changes(
    docs: Sequence[SourceDocument],
    versions: Sequence[DocumentVersion],
    *,
    rechunk: bool = False,
    delete_missing: bool = False,
) -> IndexPlan:
    """Compares loaded files with stored versions by content hash.

    A file whose active version has the same hash is unchanged (unless the
    chunking settings changed: ``rechunk``). Anything else gets the next free
    version number. With ``delete_missing``, active documents absent from
    ``docs`` are deleted.
    """
    active = {v.doc_id: v for v in versions if v.status == ACTIVE}
    latest: dict[str, int] = {}
    for v in versions:
        latest[v.doc_id] = max(latest.get(v.doc_id, 0), v.version)
    to_write, unchanged = [], []
    for doc in docs:
        previous = active.get(doc.doc_id)
        if previous is not None and previous.content_hash == doc.content_hash and not rechunk:
            unchanged.append(doc)
        else:
            to_write.append(DocumentPlan(doc, latest.get(doc.doc_id, 0) + 1, previous))
    seen = {doc.doc_id for doc in docs}
    to_delete = [v for doc_id, v in sorted(active.items()) if doc_id not in seen] if delete_missing else []
    return IndexPlan(tuple(to_write), tuple(unchanged), tuple(to_delete))
