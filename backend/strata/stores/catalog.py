"""Read queries over the SQL store that browse rather than search.

What the service needs besides retrieval: a kb's document listing, the
front-matter modules and skill points known in some kbs, and the chunks of a
module's documents in document order. Only active versions are visible, as
in retrieval. Read-only, on the tables of ``sql_schema``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, and_, select, tuple_
from sqlalchemy.exc import SQLAlchemyError

from strata.errors import StoreError
from strata.stores.chunks import chunk_from_row
from strata.stores.sql_schema import chunks, documents
from strata.types import ACTIVE, Chunk


@dataclass(frozen=True)
class DocumentEntry:
    """One served document of a kb, as a listing shows it."""

    doc_id: str
    version: int
    source: str
    leaf_count: int
    chunk_count: int
    metadata: Mapping[str, Any] = field(default_factory=dict)
    updated_at: datetime | None = None


@dataclass(frozen=True)
class Vocabulary:
    """Front-matter modules and skill points of the served documents of some kbs."""

    modules: tuple[str, ...] = ()
    skill_points: tuple[str, ...] = ()

    @property
    def terms(self) -> tuple[str, ...]:
        """Modules and skill points together (the BM25 analyzer's user dictionary)."""
        return tuple(dict.fromkeys(self.modules + self.skill_points))


class Catalog:
    """Browsing reads on the SQL engine of a ``DocumentStore``."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def documents(self, kb_id: str) -> list[DocumentEntry]:
        """The active documents of a kb, by source path."""
        query = (
            select(documents)
            .where(documents.c.kb_id == kb_id, documents.c.status == ACTIVE)
            .order_by(documents.c.source, documents.c.doc_id)
        )
        rows = self._rows(query)
        return [
            DocumentEntry(r.doc_id, r.version, r.source, r.leaf_count, r.chunk_count, r.metadata or {}, r.updated_at)
            for r in rows
        ]

    def vocabulary(self, kb_ids: Sequence[str] | None) -> Vocabulary:
        """Distinct modules and skill points of the active documents of ``kb_ids`` (None = all kbs)."""
        modules: dict[str, None] = {}
        points: dict[str, None] = {}
        for meta in self._active_metadata(kb_ids):
            if isinstance(meta.get("module"), str) and meta["module"]:
                modules[meta["module"]] = None
            points.update(dict.fromkeys(str(p) for p in meta.get("skill_points") or () if str(p)))
        return Vocabulary(tuple(sorted(modules)), tuple(sorted(points)))

    def module_chunks(self, kb_ids: Sequence[str] | None, module: str, *, level: int, limit: int) -> list[Chunk]:
        """Chunks of one level of the documents whose module is ``module``, in document order."""
        versions = self._module_versions(kb_ids, module)
        if not versions:
            return []
        order = {key: n for n, key in enumerate(versions)}
        query = select(chunks).where(
            tuple_(chunks.c.kb_id, chunks.c.doc_id, chunks.c.version).in_(list(versions)), chunks.c.level == level
        )
        rows = sorted(self._rows(query), key=lambda r: (order[(r.kb_id, r.doc_id, r.version)], r.ordinal))
        return [chunk_from_row(r) for r in rows[:limit]]

    def _module_versions(self, kb_ids: Sequence[str] | None, module: str) -> list[tuple[str, str, int]]:
        query = select(documents.c.kb_id, documents.c.doc_id, documents.c.version, documents.c.metadata).where(
            *_active(kb_ids)
        )
        rows = self._rows(query.order_by(documents.c.kb_id, documents.c.source, documents.c.doc_id))
        return [(r.kb_id, r.doc_id, r.version) for r in rows if (r.metadata or {}).get("module") == module]

    def _active_metadata(self, kb_ids: Sequence[str] | None) -> list[Mapping[str, Any]]:
        rows = self._rows(select(documents.c.metadata).where(*_active(kb_ids)))
        return [r.metadata or {} for r in rows]

    def _rows(self, query: Any) -> list[Any]:
        try:
            with self._engine.connect() as conn:
                return list(conn.execute(query))
        except SQLAlchemyError as exc:
            raise StoreError(f"SQL catalog read failed: {exc}") from exc


def _active(kb_ids: Sequence[str] | None) -> list[Any]:
    clauses = [documents.c.status == ACTIVE]
    if kb_ids is not None:
        clauses.append(documents.c.kb_id.in_(list(kb_ids)))
    return [and_(*clauses)]
