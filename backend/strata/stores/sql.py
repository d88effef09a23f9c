"""The SQL document/chunk store (SQLAlchemy 2; PostgreSQL or SQLite).

SQL is the source of truth: knowledge bases, every document version with its
status (``pending`` → ``active`` → ``retired``), chunks of every level and the
embedding cache. Milvus and the parent cache can be rebuilt from it.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
from sqlalchemy import Engine, and_, create_engine, delete, event, func, inspect, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from strata.config import DatabaseSettings
from strata.errors import EncoderMismatchError, StoreError
from strata.stores.keys import version_key
from strata.stores.sql_schema import (
    ADDED_COLUMNS, chunks, documents, embedding_cache, kb_terms, knowledge_bases, metadata, version_terms,
)  # fmt: skip
from strata.stores.term_stats import (
    TermFrequencies, drop_absent_terms, insert_version_terms, kb_terms_missing, read_frequent_terms,
    rebuild_kb_terms, start_serving, stop_serving, uncounted_versions,
)  # fmt: skip
from strata.types import ACTIVE, PENDING, RETIRED, Chunk, DocumentVersion, KnowledgeBase, ServingState

logger = logging.getLogger(__name__)

_IN_BATCH = 900  # ids per IN (...) clause; far under SQLite's variable limit
_INSERT_BATCH = 500  # rows per multi-row INSERT: 500 x 3 columns stays under SQLite's 32,766 variables

__all__ = ["ACTIVE", "PENDING", "RETIRED", "DocumentStore", "DocumentVersion", "KnowledgeBase", "ServingState"]


class DocumentStore:
    """Documents, chunks and the embedding cache in one SQL database."""

    def __init__(self, settings: DatabaseSettings) -> None:
        self.engine = _create_engine(settings)
        self._query_timeout_ms = int(settings.query_timeout_s * 1000)
        try:
            metadata.create_all(self.engine)
            _add_missing_columns(self.engine)
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot prepare the SQL schema at {_safe_url(self.engine)}: {exc}") from exc

    # -- knowledge bases --------------------------------------------------------

    def ensure_kb(self, kb_id: str, *, encoder: str, dim: int, chunking: str) -> KnowledgeBase:
        """The kb row, created if missing; refuses a kb built with another encoder."""
        with self._begin() as conn:
            row = conn.execute(select(knowledge_bases).where(knowledge_bases.c.kb_id == kb_id)).first()
            if row is None:
                # created_at to the microsecond is the kb's epoch: a kb created anew never repeats a cache key
                values = dict(kb_id=kb_id, encoder=encoder, dim=dim, chunking=chunking, generation=0, created_at=_now())
                conn.execute(knowledge_bases.insert().values(**values))
                row = conn.execute(select(knowledge_bases).where(knowledge_bases.c.kb_id == kb_id)).one()
                return _kb(row)
        if row.encoder != encoder or row.dim != dim:
            raise EncoderMismatchError(
                f"knowledge base {kb_id!r} was built with encoder {row.encoder} (dim {row.dim}); "
                f"the configured encoder is {encoder} (dim {dim}). Rebuild it with --recreate or use another kb."
            )
        return _kb(row)

    def set_encoder(self, kb_id: str, *, encoder: str, dim: int) -> None:
        """Records a new encoder for a kb (a ``--recreate`` with another encoder, at its switch)."""
        with self._begin() as conn:
            conn.execute(update(knowledge_bases).where(knowledge_bases.c.kb_id == kb_id).values(encoder=encoder, dim=dim))

    def set_chunking(self, kb_id: str, chunking: str) -> None:
        with self._begin() as conn:
            conn.execute(update(knowledge_bases).where(knowledge_bases.c.kb_id == kb_id).values(chunking=chunking))

    def get_kb(self, kb_id: str) -> KnowledgeBase | None:
        with self._connect() as conn:
            row = conn.execute(select(knowledge_bases).where(knowledge_bases.c.kb_id == kb_id)).first()
        return _kb(row) if row else None

    def list_kbs(self) -> list[KnowledgeBase]:
        with self._connect() as conn:
            return [_kb(r) for r in conn.execute(select(knowledge_bases).order_by(knowledge_bases.c.kb_id))]

    def drop_kb(self, kb_id: str) -> None:
        with self._begin() as conn:
            for table in (kb_terms, version_terms, chunks, documents, knowledge_bases):
                conn.execute(delete(table).where(table.c.kb_id == kb_id))

    # -- document versions -----------------------------------------------------

    def versions(self, kb_id: str, doc_id: str | None = None) -> list[DocumentVersion]:
        """Every stored version of a kb (or of one document), oldest first."""
        query = select(documents).where(documents.c.kb_id == kb_id)
        if doc_id is not None:
            query = query.where(documents.c.doc_id == doc_id)
        with self._connect() as conn:
            rows = conn.execute(query.order_by(documents.c.doc_id, documents.c.version)).all()
        return [_version(r) for r in rows]

    def write_pending(
        self, version: DocumentVersion, doc_chunks: Sequence[Chunk], term_counts: Mapping[str, int] | None = None
    ) -> None:
        """The document version as ``pending`` plus all its chunks, in one transaction (idempotent);
        with ``term_counts`` (term -> leaves holding it, ``term_stats.count_terms``) its term statistics too."""
        row = {
            "kb_id": version.kb_id, "doc_id": version.doc_id, "version": version.version,
            "source": version.source, "content_hash": version.content_hash, "status": PENDING,
            "leaf_count": version.leaf_count, "chunk_count": len(doc_chunks), "metadata": dict(version.metadata),
            "root": version.root or None,
        }  # fmt: skip
        with self._begin() as conn:
            self._delete_version_rows(conn, version.kb_id, version.doc_id, version.version)
            conn.execute(documents.insert().values(**row))
            for start in range(0, len(doc_chunks), 500):
                conn.execute(chunks.insert(), [_chunk_row(c) for c in doc_chunks[start : start + 500]])
            if term_counts is not None:
                insert_version_terms(conn, version.kb_id, version.doc_id, version.version, term_counts)
            self._bump(conn, version.kb_id)  # the serving state changed: a version to hide

    def activate(self, kb_id: str, doc_id: str, version: int) -> None:
        """Serve ``version``; every other version of the document becomes ``retired``."""
        self.switch(kb_id, [(doc_id, version)])

    def switch(self, kb_id: str, activate: Sequence[tuple[str, int]], *, retire: Sequence[str] = ()) -> None:
        """In one transaction: serve each (doc id, version), retiring the document's other versions,
        and stop serving the documents in ``retire`` (a ``--recreate``'s switch to its new generation).
        The kb's term sums follow: what starts serving is added, what stops is subtracted."""
        with self._begin() as conn:
            serving = self._serving_versions(conn, kb_id, [doc_id for doc_id, _ in activate])
            for doc_id, version in activate:
                for old in serving.get(doc_id, set()) - {version}:
                    stop_serving(conn, kb_id, doc_id, old)
                if version not in serving.get(doc_id, set()):
                    start_serving(conn, kb_id, doc_id, version)
                doc = and_(documents.c.kb_id == kb_id, documents.c.doc_id == doc_id)
                conn.execute(update(documents).where(doc, documents.c.version != version).values(status=RETIRED))
                conn.execute(update(documents).where(doc, documents.c.version == version).values(status=ACTIVE))
            gone = self._serving_versions(conn, kb_id, retire)
            for doc_id, versions in gone.items():
                for version in versions:
                    stop_serving(conn, kb_id, doc_id, version)
            for start in range(0, len(retire), _IN_BATCH):
                batch = list(retire[start : start + _IN_BATCH])
                conn.execute(
                    update(documents).where(documents.c.kb_id == kb_id, documents.c.doc_id.in_(batch)).values(status=RETIRED)
                )
            drop_absent_terms(conn, kb_id)
            self._bump(conn, kb_id)

    @staticmethod
    def _serving_versions(conn: Connection, kb_id: str, doc_ids: Sequence[str]) -> dict[str, set[int]]:
        """The active versions of ``doc_ids``: doc id -> versions (one SELECT per 900 documents)."""
        found: dict[str, set[int]] = {}
        wanted = list(dict.fromkeys(doc_ids))
        for start in range(0, len(wanted), _IN_BATCH):
            query = select(documents.c.doc_id, documents.c.version).where(
                documents.c.kb_id == kb_id, documents.c.doc_id.in_(wanted[start : start + _IN_BATCH]),
                documents.c.status == ACTIVE,
            )  # fmt: skip
            for row in conn.execute(query):
                found.setdefault(row.doc_id, set()).add(row.version)
        return found

    def set_roots(self, kb_id: str, roots: Mapping[str, str]) -> None:
        """Records the folder each (unchanged) document was last indexed from: doc id -> root."""
        with self._begin() as conn:
            for doc_id, root in roots.items():
                conn.execute(
                    update(documents).where(documents.c.kb_id == kb_id, documents.c.doc_id == doc_id).values(root=root)
                )

    def retire_document(self, kb_id: str, doc_id: str) -> None:
        """Stop serving every version of a document (deletion, step 1)."""
        with self._begin() as conn:
            for version in self._serving_versions(conn, kb_id, [doc_id]).get(doc_id, set()):
                stop_serving(conn, kb_id, doc_id, version)
            conn.execute(
                update(documents).where(documents.c.kb_id == kb_id, documents.c.doc_id == doc_id).values(status=RETIRED)
            )
            drop_absent_terms(conn, kb_id)
            self._bump(conn, kb_id)

    def delete_version(self, kb_id: str, doc_id: str, version: int) -> None:
        """Remove a version's chunks and row (after its leaves left Milvus)."""
        with self._begin() as conn:
            self._delete_version_rows(conn, kb_id, doc_id, version)

    @staticmethod
    def _delete_version_rows(conn: Connection, kb_id: str, doc_id: str, version: int) -> None:
        for table in (version_terms, chunks, documents):
            conn.execute(
                delete(table).where(table.c.kb_id == kb_id, table.c.doc_id == doc_id, table.c.version == version)
            )

    @staticmethod
    def _bump(conn: Connection, kb_id: str) -> None:
        conn.execute(
            update(knowledge_bases)
            .where(knowledge_bases.c.kb_id == kb_id)
            .values(generation=knowledge_bases.c.generation + 1)
        )

    # -- term statistics (BM25 query hygiene, see term_stats) ---------------------

    def write_terms(self, kb_id: str, doc_id: str, version: int, term_counts: Mapping[str, int]) -> None:
        """Replaces a version's term statistics (a backfill of a version written before they were kept)."""
        with self._begin() as conn:
            conn.execute(
                delete(version_terms).where(
                    version_terms.c.kb_id == kb_id, version_terms.c.doc_id == doc_id, version_terms.c.version == version
                )
            )
            insert_version_terms(conn, kb_id, doc_id, version, term_counts)

    def rebuild_kb_terms(self, kb_id: str) -> int:
        """Sums the kb's term df anew from its active versions (after a backfill or a repair)."""
        with self._begin() as conn:
            return rebuild_kb_terms(conn, kb_id)

    def kb_terms_missing(self, kb_id: str) -> bool:
        """True when the kb's versions are counted but their sums are not (an older database)."""
        with self._connect() as conn:
            return kb_terms_missing(conn, kb_id)

    def frequent_terms(self, kb_ids: Sequence[str], max_df: float, *, timeout_s: float | None = None) -> TermFrequencies:
        """The active leaves of ``kb_ids`` and the terms in more than ``max_df`` of them (indexed reads
        of the kbs' term sums, under the query timeout)."""
        with self._connect() as conn:
            self._limit_statement_time(conn, timeout_s)
            return read_frequent_terms(conn, kb_ids, max_df)

    def uncounted_versions(self, kb_id: str) -> list[tuple[str, int]]:
        """(doc id, version) of the kb's active versions whose term statistics are missing."""
        with self._connect() as conn:
            return uncounted_versions(conn, kb_id)

    # -- chunks ----------------------------------------------------------------

    def get_chunks(self, chunk_ids: Iterable[str], *, timeout_s: float | None = None) -> dict[str, Chunk]:
        """Chunks by id: one SELECT per 900 ids (one for any auto-merge round), under the query timeout."""
        ids = list(dict.fromkeys(chunk_ids))
        found: dict[str, Chunk] = {}
        with self._connect() as conn:
            self._limit_statement_time(conn, timeout_s)
            for start in range(0, len(ids), _IN_BATCH):
                batch = ids[start : start + _IN_BATCH]
                for row in conn.execute(select(chunks).where(chunks.c.chunk_id.in_(batch))):
                    found[row.chunk_id] = chunk_from_row(row)
        return found

    def version_chunks(self, kb_id: str, doc_id: str, version: int, *, levels: Sequence[int] = (1, 2, 3)) -> list[Chunk]:
        query = select(chunks).where(
            chunks.c.kb_id == kb_id, chunks.c.doc_id == doc_id, chunks.c.version == version, chunks.c.level.in_(levels)
        )
        with self._connect() as conn:
            return [chunk_from_row(r) for r in conn.execute(query.order_by(chunks.c.level, chunks.c.ordinal))]

    # -- what queries need -----------------------------------------------------

    def active_chunk_ids(self, kb_id: str, *, levels: Sequence[int] = (3,)) -> set[str]:
        """Chunk ids of the kb's active versions at ``levels`` (L3: what Milvus must hold)."""
        active = and_(documents.c.kb_id == chunks.c.kb_id, documents.c.doc_id == chunks.c.doc_id,
                      documents.c.version == chunks.c.version, documents.c.status == ACTIVE)  # fmt: skip
        query = select(chunks.c.chunk_id).join(documents, active).where(chunks.c.kb_id == kb_id, chunks.c.level.in_(levels))
        with self._connect() as conn:
            return set(conn.execute(query).scalars())

    def active_chunks(self, *, limit: int) -> list[Chunk]:
        """Up to ``limit`` chunks of the active versions of every kb, leaves first, then L2, then L1
        (what a warm-up can cache)."""
        active = and_(documents.c.kb_id == chunks.c.kb_id, documents.c.doc_id == chunks.c.doc_id,
                      documents.c.version == chunks.c.version, documents.c.status == ACTIVE)  # fmt: skip
        query = select(chunks).join(documents, active).order_by(chunks.c.level.desc()).limit(limit)
        with self._connect() as conn:
            return [chunk_from_row(r) for r in conn.execute(query)]

    def generations(self, kb_ids: Sequence[str] | None, *, timeout_s: float | None = None) -> dict[str, str]:
        """Each kb's "epoch#generation": what changes whenever its serving state does (one small query)."""
        kb = knowledge_bases
        query = select(kb.c.kb_id, kb.c.generation, kb.c.created_at)
        if kb_ids is not None:
            query = query.where(kb.c.kb_id.in_(list(kb_ids)))
        with self._connect() as conn:
            self._limit_statement_time(conn, timeout_s)
            return {r.kb_id: _generation(r) for r in conn.execute(query)}

    def serving_state(self, kb_ids: Sequence[str] | None, *, timeout_s: float | None = None) -> ServingState:
        """Each kb's (epoch, generation) and the versions not to serve, in one query.

        Runs under the query-path statement timeout (``STRATA_DATABASE__QUERY_TIMEOUT_S``).
        """
        kb = knowledge_bases
        query = select(kb.c.kb_id, kb.c.generation, kb.c.created_at, documents.c.doc_id, documents.c.version).outerjoin(
            documents, and_(documents.c.kb_id == kb.c.kb_id, documents.c.status != ACTIVE)
        )
        if kb_ids is not None:
            query = query.where(kb.c.kb_id.in_(list(kb_ids)))
        with self._connect() as conn:
            self._limit_statement_time(conn, timeout_s)
            rows = conn.execute(query).all()
        generations = {r.kb_id: _generation(r) for r in rows}
        hidden = tuple(version_key(r.kb_id, r.doc_id, r.version) for r in rows if r.doc_id is not None)
        return ServingState(generations=generations, hidden_version_keys=hidden)

    def _limit_statement_time(self, conn: Connection, timeout_s: float | None = None) -> None:
        """A hung PostgreSQL costs the query path at most the query timeout (or ``timeout_s``), not forever."""
        if self.engine.dialect.name == "postgresql":
            limit_ms = self._query_timeout_ms if timeout_s is None else min(self._query_timeout_ms, int(timeout_s * 1000))
            conn.exec_driver_sql(f"SET LOCAL statement_timeout = {max(1, limit_ms)}")

    def stats(self, kb_id: str) -> dict[str, Any]:
        """Documents by status and chunks by level of the active versions."""
        active = select(documents.c.doc_id, documents.c.version).where(
            documents.c.kb_id == kb_id, documents.c.status == ACTIVE
        ).subquery()
        with self._connect() as conn:
            by_status = dict(
                conn.execute(
                    select(documents.c.status, func.count()).where(documents.c.kb_id == kb_id).group_by(documents.c.status)
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

    # -- embedding cache -------------------------------------------------------

    def cached_embeddings(self, encoder: str, text_hashes: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        hashes = list(dict.fromkeys(text_hashes))
        with self._connect() as conn:
            for start in range(0, len(hashes), _IN_BATCH):
                query = select(embedding_cache.c.text_hash, embedding_cache.c.vector).where(
                    embedding_cache.c.encoder == encoder,
                    embedding_cache.c.text_hash.in_(hashes[start : start + _IN_BATCH]),
                )
                for text_hash, blob in conn.execute(query):
                    found[text_hash] = np.frombuffer(blob, dtype=np.float32)
        return found

    def cache_embeddings(self, encoder: str, vectors: Mapping[str, np.ndarray]) -> None:
        if not vectors:
            return
        rows = [
            {"encoder": encoder, "text_hash": h, "vector": np.asarray(v, dtype=np.float32).tobytes()}
            for h, v in vectors.items()
        ]
        with self._begin() as conn:
            for start in range(0, len(rows), _INSERT_BATCH):
                batch = rows[start : start + _INSERT_BATCH]
                conn.execute(self._insert(embedding_cache).values(batch).on_conflict_do_nothing())

    # -- plumbing --------------------------------------------------------------

    def _insert(self, table: Any) -> Any:
        dialect = postgresql if self.engine.dialect.name == "postgresql" else sqlite
        return dialect.insert(table)

    def _connect(self) -> Any:
        return _translated(self.engine.connect, self.engine)

    def _begin(self) -> Any:
        return _translated(self.engine.begin, self.engine)

    def dispose(self) -> None:
        self.engine.dispose()


@contextmanager
def _translated(factory: Any, engine: Engine) -> Iterator[Connection]:
    """Runs a connection block, turning SQLAlchemy errors into ``StoreError``."""
    try:
        with factory() as conn:
            yield conn
    except SQLAlchemyError as exc:
        raise StoreError(f"SQL store {_safe_url(engine)} failed: {exc}") from exc


def _create_engine(settings: DatabaseSettings) -> Engine:
    url = str(settings.url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, echo=settings.echo, connect_args={"timeout": settings.connect_timeout_s * 6})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        echo=settings.echo,
        pool_size=settings.pool_size,
        pool_pre_ping=True,
        connect_args={"connect_timeout": max(1, int(settings.connect_timeout_s))},
    )


def _add_missing_columns(engine: Engine) -> None:
    """Adds columns introduced after a table was first created (a database from an earlier strata)."""
    inspector = inspect(engine)
    for table, columns in ADDED_COLUMNS.items():
        present = {c["name"] for c in inspector.get_columns(table)}
        for column in columns:
            if column.name not in present:
                kind = column.type.compile(dialect=engine.dialect)
                with engine.begin() as conn:
                    conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column.name} {kind}")
                logger.info("added column %s.%s to an existing database", table, column.name)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")  # readers never block the writer
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _safe_url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _kb(row: Any) -> KnowledgeBase:
    return KnowledgeBase(row.kb_id, row.encoder, row.dim, row.chunking, row.generation, _epoch(row.created_at))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _generation(row: Any) -> str:
    """A kb's "epoch#generation" from its row: a kb dropped and created again starts a new epoch."""
    return f"{_epoch(row.created_at)}#{row.generation}"


def _epoch(created_at: datetime | None) -> str:
    if created_at is None:
        return ""
    if created_at.tzinfo is not None:  # PostgreSQL answers in the session's time zone
        created_at = created_at.astimezone(timezone.utc).replace(tzinfo=None)
    return created_at.isoformat()


def _version(row: Any) -> DocumentVersion:
    return DocumentVersion(
        kb_id=row.kb_id, doc_id=row.doc_id, version=row.version, source=row.source,
        content_hash=row.content_hash, status=row.status, leaf_count=row.leaf_count,
        chunk_count=row.chunk_count, metadata=row.metadata or {}, root=row.root or "",
    )  # fmt: skip


def _chunk_row(c: Chunk) -> dict[str, Any]:
    return {
        "chunk_id": c.chunk_id, "kb_id": c.kb_id, "doc_id": c.doc_id, "version": c.version,
        "level": c.level, "parent_id": c.parent_id, "root_id": c.root_id, "ordinal": c.ordinal,
        "text": c.text, "heading_path": c.heading_path, "char_start": c.char_start,
        "char_end": c.char_end, "child_count": c.child_count, "metadata": dict(c.metadata),
    }  # fmt: skip


def chunk_from_row(row: Any) -> Chunk:
    """A chunk row of ``strata_chunks`` as a ``Chunk``."""
    return Chunk(
        chunk_id=row.chunk_id, kb_id=row.kb_id, doc_id=row.doc_id, version=row.version,
        level=row.level, parent_id=row.parent_id, root_id=row.root_id, ordinal=row.ordinal,
        text=row.text, heading_path=row.heading_path, char_start=row.char_start,
        char_end=row.char_end, child_count=row.child_count, metadata=row.metadata or {},
    )  # fmt: skip
