"""The SQL document/chunk store (SQLAlchemy 2; PostgreSQL or SQLite).

SQL is the source of truth: knowledge bases, every document version with its
status (``pending`` → ``active`` → ``retired``), chunks of every level, term
statistics and the embedding cache. Milvus and the parent cache can be rebuilt
from it. Each of those is a store of its own module over one ``SqlDatabase``;
``DocumentStore`` is all of them together, what the engine's callers hold.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

from strata.config import DatabaseSettings
from strata.stores.chunks import Chunks
from strata.stores.embedding_cache import EmbeddingCache
from strata.stores.invalidations import CacheInvalidations
from strata.stores.knowledge_bases import KnowledgeBases
from strata.stores.schema_version import open_schema
from strata.stores.sql_database import SqlDatabase
from strata.stores.term_stats import TermStatistics
from strata.stores.versions import DocumentVersions
from strata.types import ACTIVE, PENDING, RETIRED, DocumentVersion, KnowledgeBase, ServingState

__all__ = ["ACTIVE", "PENDING", "RETIRED", "DocumentStore", "DocumentVersion", "KnowledgeBase", "ServingState"]


class DocumentStore(KnowledgeBases, DocumentVersions, Chunks, TermStatistics, EmbeddingCache, CacheInvalidations):
    """Knowledge bases, document versions, chunks, term statistics, the embedding cache and the
    cache invalidations still to do, of one database."""

    def __init__(self, settings: DatabaseSettings) -> None:
        db = SqlDatabase(settings)
        open_schema(db.engine)  # SQLite upgrades itself; PostgreSQL behind `strata db upgrade` is refused
        super().__init__(db)

    def fenced(self, kb_id: str, owner: str) -> AbstractContextManager[None]:
        """This thread's transactions go on only while ``owner`` holds ``kb_id``'s lease (``SqlDatabase.fenced``)."""
        return self._db.fenced(kb_id, owner)

    def now(self) -> datetime:
        """The database's clock (naive UTC): leases expire by it."""
        return self._db.now()

    def check_fences(self) -> None:
        """``LeaseLostError`` when a lease this thread writes under was taken: called before each Milvus write."""
        self._db.check_fences()

    def dispose(self) -> None:
        self._db.dispose()
