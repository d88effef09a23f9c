"""Chunks of every level in SQL, read by id, by version or as what the active versions serve."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from sqlalchemy import and_, or_, select

from strata.stores.sql_database import IN_BATCH, SqlPart
from strata.stores.sql_schema import chunks, documents
from strata.types import ACTIVE, Chunk


class Chunks(SqlPart):
    """Chunk reads (chunks are written with their version, ``DocumentVersions.write_pending``)."""

    def get_chunks(self, chunk_ids: Iterable[str], *, timeout_s: float | None = None) -> dict[str, Chunk]:
        """Chunks by id: one SELECT per 900 ids (one for any auto-merge round), under the query timeout."""
        ids = list(dict.fromkeys(chunk_ids))
        found: dict[str, Chunk] = {}
        with self._query_path(timeout_s) as conn:
            for start in range(0, len(ids), IN_BATCH):
                batch = ids[start : start + IN_BATCH]
                for row in conn.execute(select(chunks).where(chunks.c.chunk_id.in_(batch))):
                    found[row.chunk_id] = chunk_from_row(row)
        return found

    def version_chunks(
        self, kb_id: str, doc_id: str, version: int, *, levels: Sequence[int] = (1, 2, 3)
    ) -> list[Chunk]:
        query = select(chunks).where(
            chunks.c.kb_id == kb_id, chunks.c.doc_id == doc_id, chunks.c.version == version, chunks.c.level.in_(levels)
        )
        with self._connect() as conn:
            return [chunk_from_row(r) for r in conn.execute(query.order_by(chunks.c.level, chunks.c.ordinal))]

    def version_chunk_ids(self, kb_id: str, doc_id: str, version: int, *, page: int = 5000) -> Iterator[list[str]]:
        """The version's chunk ids, ``page`` at a time in id order (keyset paging: a page per query, so a
        version of 200,000 chunks is never held at once)."""
        of_version = select(chunks.c.chunk_id).where(
            chunks.c.kb_id == kb_id, chunks.c.doc_id == doc_id, chunks.c.version == version
        )
        pages = self._pages(
            lambda after: of_version.where(chunks.c.chunk_id > after).order_by(chunks.c.chunk_id),
            "",
            page,
            lambda row: row.chunk_id,
        )
        for rows in pages:
            yield [r.chunk_id for r in rows]

    def version_chunk_pages(
        self, kb_id: str, doc_id: str, version: int, *, levels: Sequence[int] = (1, 2, 3), page: int = 2000
    ) -> Iterator[list[Chunk]]:
        """The version's chunks at ``levels``, ``page`` at a time in ``version_chunks``'s order (level, then
        ordinal: the order they were written in), a query per page."""
        of_version = select(chunks).where(
            chunks.c.kb_id == kb_id, chunks.c.doc_id == doc_id, chunks.c.version == version, chunks.c.level.in_(levels)
        )

        def after(key: tuple[int, int]) -> Any:
            level, ordinal = key
            later = or_(chunks.c.level > level, and_(chunks.c.level == level, chunks.c.ordinal > ordinal))
            return of_version.where(later).order_by(chunks.c.level, chunks.c.ordinal)

        for rows in self._pages(after, (0, -1), page, lambda row: (row.level, row.ordinal)):
            yield [chunk_from_row(r) for r in rows]

    def _pages(
        self, query_after: Callable[[Any], Any], start: Any, page: int, key: Callable[[Any], Any]
    ) -> Iterator[list[Any]]:
        """Keyset paging: the rows of ``query_after(key of the last row so far)``, ``page`` per query."""
        after = start
        while True:
            with self._connect() as conn:
                rows = list(conn.execute(query_after(after).limit(page)))
            if rows:
                yield rows
            if len(rows) < page:
                return
            after = key(rows[-1])

    def active_chunk_ids(self, kb_id: str, *, levels: Sequence[int] = (3,)) -> set[str]:
        """Chunk ids of the kb's active versions at ``levels`` (L3: what Milvus must hold)."""
        query = (
            select(chunks.c.chunk_id)
            .join(documents, _of_active_version())
            .where(chunks.c.kb_id == kb_id, chunks.c.level.in_(levels))
        )
        with self._connect() as conn:
            return set(conn.execute(query).scalars())

    def active_chunks(self, *, limit: int) -> list[Chunk]:
        """Up to ``limit`` chunks of the active versions of every kb, leaves first, then L2, then L1
        (what a warm-up can cache)."""
        query = select(chunks).join(documents, _of_active_version()).order_by(chunks.c.level.desc()).limit(limit)
        with self._connect() as conn:
            return [chunk_from_row(r) for r in conn.execute(query)]


def _of_active_version() -> Any:
    return and_(
        documents.c.kb_id == chunks.c.kb_id,
        documents.c.doc_id == chunks.c.doc_id,
        documents.c.version == chunks.c.version,
        documents.c.status == ACTIVE,
    )


def chunk_row(c: Chunk) -> dict[str, Any]:
    """A ``Chunk`` as a row of ``strata_chunks``."""
    return {
        "chunk_id": c.chunk_id,
        "kb_id": c.kb_id,
        "doc_id": c.doc_id,
        "version": c.version,
        "level": c.level,
        "parent_id": c.parent_id,
        "root_id": c.root_id,
        "ordinal": c.ordinal,
        "text": c.text,
        "heading_path": c.heading_path,
        "char_start": c.char_start,
        "char_end": c.char_end,
        "child_count": c.child_count,
        "metadata": dict(c.metadata),
    }


def chunk_from_row(row: Any) -> Chunk:
    """A chunk row of ``strata_chunks`` as a ``Chunk``."""
    return Chunk(
        chunk_id=row.chunk_id,
        kb_id=row.kb_id,
        doc_id=row.doc_id,
        version=row.version,
        level=row.level,
        parent_id=row.parent_id,
        root_id=row.root_id,
        ordinal=row.ordinal,
        text=row.text,
        heading_path=row.heading_path,
        char_start=row.char_start,
        char_end=row.char_end,
        child_count=row.child_count,
        metadata=row.metadata or {},
    )
