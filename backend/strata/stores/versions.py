"""Document versions in SQL and their lifecycle: ``pending`` → ``active`` → ``retired``.

A version is written ``pending`` with all its chunks (and its term counts) in
one transaction, then switched to ``active`` while the document's other
versions retire, in another; the kb's term sums and generation follow every
status change in the transaction that makes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.engine import Connection

from strata.stores.chunks import chunk_row
from strata.stores.knowledge_bases import bump_generation
from strata.stores.sql_database import IN_BATCH, INSERT_BATCH, SqlPart
from strata.stores.sql_schema import chunks, documents, version_marks, version_terms
from strata.stores.term_stats import (
    drop_absent_terms,
    insert_term_rows,
    insert_version_terms,
    start_serving,
    stop_serving,
    version_term_rows,
)
from strata.types import ACTIVE, PENDING, RETIRED, Chunk, DocumentVersion


class DocumentVersions(SqlPart):
    """Every stored version of every document, and which of them a kb serves."""

    def of_kb(self, kb_id: str, doc_id: str | None = None) -> list[DocumentVersion]:
        """Every stored version of a kb (or of one of its documents), oldest first."""
        query = select(documents).where(documents.c.kb_id == kb_id)
        if doc_id is not None:
            query = query.where(documents.c.doc_id == doc_id)
        with self._connect() as conn:
            rows = conn.execute(query.order_by(documents.c.doc_id, documents.c.version)).all()
        return [_version(r) for r in rows]

    def version_marks(self, kb_id: str) -> dict[str, int]:
        """The highest version each document of a kb was ever given, deleted ones included: doc id -> version.

        The mark rises when a version is first written (pending) and when it is activated: a new version is
        numbered above it, so a version number, hence its chunk ids, is never given twice: not after it
        served (it may be in a cache), and not after a crash or a lost lease left it pending (its parents may
        be cached, its leaves written by a run that no longer holds the kb).
        """
        query = select(version_marks.c.doc_id, version_marks.c.last_version).where(version_marks.c.kb_id == kb_id)
        with self._connect() as conn:
            return {row.doc_id: row.last_version for row in conn.execute(query)}

    def write_pending(
        self,
        version: DocumentVersion,
        doc_chunks: Sequence[Chunk],
        term_counts: Mapping[str, int] | None = None,
        *,
        chunk_count: int | None = None,
    ) -> None:
        """The document version as ``pending`` plus all its chunks, in one transaction (idempotent);
        with ``term_counts`` (term -> leaves holding it, ``term_stats.count_terms``) its term statistics too.

        A document too large to hold its chunks at once passes none and its ``chunk_count``, then adds its
        chunks batch by batch (``add_chunks``): the version stays pending, hidden, until all are written."""
        with self._begin() as conn:
            _write_pending(conn, version, doc_chunks, term_counts, chunk_count)
            bump_generation(conn, version.kb_id)  # the serving state changed: a version to hide

    def write_pending_many(self, pending: Sequence[PendingVersion]) -> None:
        """``write_pending`` of several versions of one kb (each with no chunks yet) in one transaction: the
        indexer writes a group of small documents' rows at once, not a transaction per document."""
        if not pending:
            return
        kb_ids = {version.kb_id for version, _, _ in pending}
        if len(kb_ids) != 1:  # a bug of the caller: the writer writes one kb's group
            raise ValueError(f"write_pending_many writes the versions of one kb, got {sorted(kb_ids)}")
        with self._begin() as conn:
            _write_pending_rows(conn, pending)
            bump_generation(conn, pending[0][0].kb_id)  # the serving state changed: versions to hide

    def add_chunks(self, doc_chunks: Sequence[Chunk], *, skip_existing: bool = False) -> None:
        """More chunks of a pending version (``write_pending`` with ``chunk_count``), in one transaction;
        ``skip_existing``: chunks the version holds already are left as they are (a resumed version)."""
        with self._begin() as conn:
            _insert_chunks(
                conn, doc_chunks, insert=self._db.insert(chunks).on_conflict_do_nothing() if skip_existing else None
            )

    def activate(self, kb_id: str, doc_id: str, version: int) -> None:
        """Serve ``version``; every other version of the document becomes ``retired``."""
        self.switch(kb_id, [(doc_id, version)])

    def switch(self, kb_id: str, activate: Sequence[tuple[str, int]], *, retire: Sequence[str] = ()) -> None:
        """In one transaction: serve each (doc id, version), retiring the document's other versions,
        and stop serving the documents in ``retire`` (a ``--recreate``'s switch to its new generation).
        The kb's term sums follow: what starts serving is added, what stops is subtracted."""
        with self._begin() as conn:
            serving = _serving_versions(conn, kb_id, [doc_id for doc_id, _ in activate])
            for doc_id, version in activate:
                for old in serving.get(doc_id, set()) - {version}:
                    stop_serving(conn, kb_id, doc_id, old)
                if version not in serving.get(doc_id, set()):
                    start_serving(conn, kb_id, doc_id, version)
                _raise_mark(conn, kb_id, doc_id, version)
                doc = and_(documents.c.kb_id == kb_id, documents.c.doc_id == doc_id)
                conn.execute(update(documents).where(doc, documents.c.version != version).values(status=RETIRED))
                conn.execute(update(documents).where(doc, documents.c.version == version).values(status=ACTIVE))
            gone = _serving_versions(conn, kb_id, retire)
            for doc_id, versions in gone.items():
                for version in versions:
                    stop_serving(conn, kb_id, doc_id, version)
            for start in range(0, len(retire), IN_BATCH):
                batch = list(retire[start : start + IN_BATCH])
                conn.execute(
                    update(documents)
                    .where(documents.c.kb_id == kb_id, documents.c.doc_id.in_(batch))
                    .values(status=RETIRED)
                )
            drop_absent_terms(conn, kb_id)
            bump_generation(conn, kb_id)

    def set_roots(self, kb_id: str, roots: Mapping[str, str]) -> None:
        """Records the folder each (unchanged) document was last indexed from: doc id -> root."""
        with self._begin() as conn:
            for doc_id, root in roots.items():
                conn.execute(
                    update(documents).where(documents.c.kb_id == kb_id, documents.c.doc_id == doc_id).values(root=root)
                )

    def set_hashes(self, kb_id: str, hashes: Mapping[str, tuple[int, str]]) -> None:
        """Records another content hash for (unchanged) versions: doc id -> (version, hash)."""
        with self._begin() as conn:
            for doc_id, (version, content_hash) in hashes.items():
                conn.execute(
                    update(documents)
                    .where(documents.c.kb_id == kb_id, documents.c.doc_id == doc_id, documents.c.version == version)
                    .values(content_hash=content_hash)
                )

    def retire_document(self, kb_id: str, doc_id: str) -> None:
        """Stop serving every version of a document (deletion, step 1)."""
        with self._begin() as conn:
            for version in _serving_versions(conn, kb_id, [doc_id]).get(doc_id, set()):
                stop_serving(conn, kb_id, doc_id, version)
            conn.execute(
                update(documents).where(documents.c.kb_id == kb_id, documents.c.doc_id == doc_id).values(status=RETIRED)
            )
            drop_absent_terms(conn, kb_id)
            bump_generation(conn, kb_id)

    def abandon(self, versions: Sequence[DocumentVersion]) -> None:
        """Those of ``versions`` still ``pending`` become ``retired``, in one (fenced) transaction: a version is
        marked abandoned here before any of its leaves is deleted, and a retired version is never continued
        or served again, so a delete that lands late (its run paused past its lease) reaches nothing that
        serves."""
        with self._begin() as conn:
            for v in versions:
                conn.execute(
                    update(documents)
                    .where(
                        documents.c.kb_id == v.kb_id,
                        documents.c.doc_id == v.doc_id,
                        documents.c.version == v.version,
                        documents.c.status == PENDING,
                    )
                    .values(status=RETIRED)
                )

    def delete_version(self, kb_id: str, doc_id: str, version: int) -> None:
        """Remove a version's chunks and row (after its leaves left Milvus)."""
        with self._begin() as conn:
            _delete_version_rows(conn, kb_id, doc_id, version)

    def stats(self, kb_id: str) -> dict[str, Any]:
        """Documents by status and chunks by level of the active versions."""
        active = (
            select(documents.c.doc_id, documents.c.version)
            .where(documents.c.kb_id == kb_id, documents.c.status == ACTIVE)
            .subquery()
        )
        with self._connect() as conn:
            by_status = dict(
                conn.execute(
                    select(documents.c.status, func.count())
                    .where(documents.c.kb_id == kb_id)
                    .group_by(documents.c.status)
                ).all()
            )
            by_level = dict(
                conn.execute(
                    select(chunks.c.level, func.count())
                    .join(active, and_(chunks.c.doc_id == active.c.doc_id, chunks.c.version == active.c.version))
                    .where(chunks.c.kb_id == kb_id)
                    .group_by(chunks.c.level)
                ).all()
            )
        return {"documents_by_status": by_status, "chunks_by_level": {str(lv): by_level.get(lv, 0) for lv in (1, 2, 3)}}


def _serving_versions(conn: Connection, kb_id: str, doc_ids: Sequence[str]) -> dict[str, set[int]]:
    """The active versions of ``doc_ids``: doc id -> versions (one SELECT per 900 documents)."""
    found: dict[str, set[int]] = {}
    wanted = list(dict.fromkeys(doc_ids))
    for start in range(0, len(wanted), IN_BATCH):
        query = select(documents.c.doc_id, documents.c.version).where(
            documents.c.kb_id == kb_id,
            documents.c.doc_id.in_(wanted[start : start + IN_BATCH]),
            documents.c.status == ACTIVE,
        )
        for row in conn.execute(query):
            found.setdefault(row.doc_id, set()).add(row.version)
    return found


def _raise_mark(conn: Connection, kb_id: str, doc_id: str, version: int) -> None:
    """The document's version mark becomes ``version`` if that is higher (one indexer per kb: its lease)."""
    doc = and_(version_marks.c.kb_id == kb_id, version_marks.c.doc_id == doc_id)
    mark = conn.execute(select(version_marks.c.last_version).where(doc)).scalar()
    if mark is None:
        conn.execute(version_marks.insert().values(kb_id=kb_id, doc_id=doc_id, last_version=version))
    elif mark < version:
        conn.execute(update(version_marks).where(doc).values(last_version=version))


def _insert_chunks(conn: Connection, doc_chunks: Sequence[Chunk], insert: Any = None) -> None:
    for start in range(0, len(doc_chunks), INSERT_BATCH):
        conn.execute(
            chunks.insert() if insert is None else insert,
            [chunk_row(c) for c in doc_chunks[start : start + INSERT_BATCH]],
        )


PendingVersion = tuple[DocumentVersion, Mapping[str, int] | None, int]
"""A version to write pending: its row, its term counts (or None) and how many chunks it will hold."""


def _write_pending(
    conn: Connection,
    version: DocumentVersion,
    doc_chunks: Sequence[Chunk],
    term_counts: Mapping[str, int] | None,
    chunk_count: int | None,
) -> None:
    row = _pending_row(version, len(doc_chunks) if chunk_count is None else chunk_count)
    _delete_version_rows(conn, version.kb_id, version.doc_id, version.version)
    _raise_mark(conn, version.kb_id, version.doc_id, version.version)
    conn.execute(documents.insert().values(**row))
    _insert_chunks(conn, doc_chunks)
    if term_counts is not None:
        insert_version_terms(conn, version.kb_id, version.doc_id, version.version, term_counts)


def _write_pending_rows(conn: Connection, pending: Sequence[PendingVersion]) -> None:
    """``_write_pending`` of many versions of one kb (none with chunks yet) in a few statements, not several
    per version: their old rows deleted, their marks raised, their rows and term rows inserted in batches."""
    kb_id = pending[0][0].kb_id
    by_number: dict[int, list[str]] = {}
    for version, _, _ in pending:
        by_number.setdefault(version.version, []).append(version.doc_id)
    for number, doc_ids in by_number.items():
        for start in range(0, len(doc_ids), IN_BATCH):
            batch = doc_ids[start : start + IN_BATCH]
            for table in (version_terms, chunks, documents):
                conn.execute(
                    delete(table).where(table.c.kb_id == kb_id, table.c.version == number, table.c.doc_id.in_(batch))
                )
    _raise_marks(conn, kb_id, {version.doc_id: version.version for version, _, _ in pending})
    rows = [_pending_row(version, chunk_count) for version, _, chunk_count in pending]
    for start in range(0, len(rows), INSERT_BATCH):
        conn.execute(documents.insert(), rows[start : start + INSERT_BATCH])
    insert_term_rows(
        conn,
        [
            row
            for version, counts, _ in pending
            if counts is not None
            for row in version_term_rows(kb_id, version.doc_id, version.version, counts)
        ],
    )


def _raise_marks(conn: Connection, kb_id: str, versions: Mapping[str, int]) -> None:
    """``_raise_mark`` of many documents: doc id -> version."""
    doc_ids = list(versions)
    marks: dict[str, int] = {}
    for start in range(0, len(doc_ids), IN_BATCH):
        batch = doc_ids[start : start + IN_BATCH]
        found = conn.execute(
            select(version_marks.c.doc_id, version_marks.c.last_version).where(
                version_marks.c.kb_id == kb_id, version_marks.c.doc_id.in_(batch)
            )
        )
        marks.update({row.doc_id: row.last_version for row in found})
    new = [{"kb_id": kb_id, "doc_id": d, "last_version": v} for d, v in versions.items() if d not in marks]
    for start in range(0, len(new), INSERT_BATCH):
        conn.execute(version_marks.insert(), new[start : start + INSERT_BATCH])
    for doc_id, version in versions.items():
        if doc_id in marks and marks[doc_id] < version:
            doc = and_(version_marks.c.kb_id == kb_id, version_marks.c.doc_id == doc_id)
            conn.execute(update(version_marks).where(doc).values(last_version=version))


def _pending_row(version: DocumentVersion, chunk_count: int) -> dict[str, Any]:
    return {
        "kb_id": version.kb_id,
        "doc_id": version.doc_id,
        "version": version.version,
        "source": version.source,
        "content_hash": version.content_hash,
        "status": PENDING,
        "leaf_count": version.leaf_count,
        "chunk_count": chunk_count,
        "metadata": dict(version.metadata),
        "root": version.root or None,
    }


def _delete_version_rows(conn: Connection, kb_id: str, doc_id: str, version: int) -> None:
    for table in (version_terms, chunks, documents):
        conn.execute(delete(table).where(table.c.kb_id == kb_id, table.c.doc_id == doc_id, table.c.version == version))


def _version(row: Any) -> DocumentVersion:
    return DocumentVersion(
        kb_id=row.kb_id,
        doc_id=row.doc_id,
        version=row.version,
        source=row.source,
        content_hash=row.content_hash,
        status=row.status,
        leaf_count=row.leaf_count,
        chunk_count=row.chunk_count,
        metadata=row.metadata or {},
        root=row.root or "",
    )
