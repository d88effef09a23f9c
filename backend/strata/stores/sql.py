"""The SQL store (SQLAlchemy 2; PostgreSQL or SQLite): one part per kind of row, over one database.

SQL is the source of truth: knowledge bases, every document version with its
status (``pending`` → ``active`` → ``retired``), chunks of every level, term
statistics, the embedding cache and the cache invalidations still to do.
Milvus and the chunk cache can be rebuilt from it. Each of those is a part of
its own module over one ``SqlDatabase``; ``DocumentStore`` holds them, one
attribute each (``store.kbs``, ``store.versions``, ``store.chunks``,
``store.terms``, ``store.embeddings``, ``store.invalidations``). A consumer
that needs a few methods of one part types it with a ``Protocol`` of its own.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy import Engine

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


class DocumentStore:
    """The SQL parts of one database: ``kbs`` (knowledge bases, their generations and serving state),
    ``versions`` (document versions, their chunk writes and lifecycle), ``chunks`` (chunk reads),
    ``terms`` (BM25 term statistics), ``embeddings`` (the embedding cache) and ``invalidations``
    (chunk-cache deletions still to do)."""

    def __init__(self, settings: DatabaseSettings) -> None:
        self.db = SqlDatabase(settings)
        open_schema(self.db.engine)  # SQLite upgrades itself; PostgreSQL behind `strata db upgrade` is refused
        self.kbs = KnowledgeBases(self.db)
        self.versions = DocumentVersions(self.db)
        self.chunks = Chunks(self.db)
        self.terms = TermStatistics(self.db)
        self.embeddings = EmbeddingCache(self.db)
        self.invalidations = CacheInvalidations(self.db)

    @property
    def engine(self) -> Engine:
        """The database's engine (``Catalog``'s browsing reads, tests)."""
        return self.db.engine

    def fenced(self, kb_id: str, owner: str) -> AbstractContextManager[None]:
        """This thread's transactions go on only while ``owner`` holds ``kb_id``'s lease (``SqlDatabase.fenced``)."""
        return self.db.fenced(kb_id, owner)

    def now(self) -> datetime:
        """The database's clock (naive UTC): leases expire by it."""
        return self.db.now()

    def check_fences(self) -> None:
        """``LeaseLostError`` when a lease this thread writes under was taken: called before each Milvus write."""
        self.db.check_fences()

    def dispose(self) -> None:
        self.db.dispose()
