"""SQL tables: the source of truth for knowledge bases, documents and chunks.

The same schema runs on SQLite (embedded) and PostgreSQL (production, JSONB
for metadata). A change here is a migration too (``stores/migrations``,
``schema_version``); a test compares these tables with the migrations' head.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB

metadata = MetaData()
_Json = JSON().with_variant(JSONB(), "postgresql")


def _timestamps() -> list[Column]:
    return [
        Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now(), onupdate=func.now()),
    ]


knowledge_bases = Table(
    "strata_knowledge_bases",
    metadata,
    Column("kb_id", String(256), primary_key=True),
    Column("encoder", String(512), nullable=False),
    Column("dim", Integer, nullable=False),
    Column("chunking", String(64), nullable=False, comment="signature of the chunking settings"),
    Column("generation", Integer, nullable=False, default=0, comment="bumped by every change; keys the query cache"),
    *_timestamps(),
)

documents = Table(
    "strata_documents",
    metadata,
    Column("kb_id", String(256), primary_key=True),
    Column("doc_id", String(2048), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("source", String(2048), nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("status", String(16), nullable=False, comment="pending | active | retired"),
    Column("leaf_count", Integer, nullable=False, default=0),
    Column("chunk_count", Integer, nullable=False, default=0),
    Column("metadata", _Json, nullable=False, default=dict),
    Column("root", String(4096), comment="absolute folder the document was indexed from; scopes --delete-missing"),
    *_timestamps(),
)
Index("ix_strata_documents_status", documents.c.kb_id, documents.c.status)

chunks = Table(
    "strata_chunks",
    metadata,
    Column("chunk_id", String(64), primary_key=True),
    Column("kb_id", String(256), nullable=False),
    Column("doc_id", String(2048), nullable=False),
    Column("version", Integer, nullable=False),
    Column("level", Integer, nullable=False),
    Column("parent_id", String(64)),
    Column("root_id", String(64), nullable=False),
    Column("ordinal", Integer, nullable=False),
    Column("text", Text, nullable=False),
    Column("heading_path", Text, nullable=False),
    Column("char_start", Integer, nullable=False),
    Column("char_end", Integer, nullable=False),
    Column("child_count", Integer, nullable=False, default=0),
    Column("metadata", _Json, nullable=False, default=dict),
)
Index("ix_strata_chunks_doc", chunks.c.kb_id, chunks.c.doc_id, chunks.c.version)

version_terms = Table(
    "strata_version_terms",
    metadata,
    Column("kb_id", String(256), primary_key=True),
    Column("doc_id", String(2048), primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("term", String(64), primary_key=True, comment='a BM25 analyzer token; "" marks the version as counted'),
    Column("leaf_df", Integer, nullable=False, comment="leaves of the version whose search text holds the term"),
)
Index("ix_strata_version_terms_term", version_terms.c.kb_id, version_terms.c.term)

kb_terms = Table(
    "strata_kb_terms",
    metadata,
    Column("kb_id", String(256), primary_key=True),
    Column("term", String(64), primary_key=True),
    Column(
        "df", Integer, nullable=False, comment="leaves of the kb's active versions whose search text holds the term"
    ),
)
Index("ix_strata_kb_terms_df", kb_terms.c.kb_id, kb_terms.c.df)

kb_embeddings = Table(
    "strata_kb_embeddings",
    metadata,
    Column("kb_id", String(256), primary_key=True, comment="a vector is reused only by the kb that encoded it"),
    Column("encoder", String(512), primary_key=True),
    Column("text_hash", String(64), primary_key=True),
    Column("vector", LargeBinary, nullable=False),
)

version_marks = Table(
    "strata_version_marks",
    metadata,
    Column("kb_id", String(256), primary_key=True),
    Column("doc_id", String(2048), primary_key=True),
    Column(
        "last_version",
        Integer,
        nullable=False,
        comment="highest version of the document ever activated; outlives its deletion",
    ),
)

cache_invalidations = Table(
    "strata_cache_invalidations",
    metadata,
    Column("kb_id", String(256), primary_key=True),
    Column("chunk_id", String(64), primary_key=True),
    Column("recorded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

kb_leases = Table(
    "strata_kb_leases",
    metadata,
    Column("kb_id", String(256), primary_key=True),
    Column("owner", String(512), nullable=False, comment="host:pid:token of the indexer holding the kb"),
    Column("acquired_at", DateTime, nullable=False),
    Column("expires_at", DateTime, nullable=False, comment="UTC; a holder renews it while it works"),
)
