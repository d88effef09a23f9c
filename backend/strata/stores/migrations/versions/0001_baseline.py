"""Baseline: the ``strata_*`` tables as strata created them before it had migrations.

Creates each table and index only where it is missing, and adds
``strata_documents.root`` to a table from before that column: so a fresh
database gets the whole schema, and a database an earlier strata made with
``create_all`` (no version table) is brought to exactly this schema and stamped,
its rows untouched. The tables are a frozen copy: later changes to
``sql_schema`` are later migrations, never edits of this file.

Revision ID: 0001
Revises:
Create Date: 2026-11-01
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
compatible_with = None  # the first revision: no older code
lossy_downgrade = "drops every strata table and its rows"

logger = logging.getLogger("strata.stores.migrations")
_ROOT_COMMENT = "absolute folder the document was indexed from; scopes --delete-missing"
_Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _timestamps() -> list[sa.Column]:
    return [
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    ]


def _baseline() -> sa.MetaData:
    meta = sa.MetaData()
    sa.Table(
        "strata_knowledge_bases",
        meta,
        sa.Column("kb_id", sa.String(256), primary_key=True),
        sa.Column("encoder", sa.String(512), nullable=False),
        sa.Column("dim", sa.Integer, nullable=False),
        sa.Column("chunking", sa.String(64), nullable=False, comment="signature of the chunking settings"),
        sa.Column("generation", sa.Integer, nullable=False, comment="bumped by every change; keys the query cache"),
        *_timestamps(),
    )
    documents = sa.Table(
        "strata_documents",
        meta,
        sa.Column("kb_id", sa.String(256), primary_key=True),
        sa.Column("doc_id", sa.String(2048), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("source", sa.String(2048), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False, comment="pending | active | retired"),
        sa.Column("leaf_count", sa.Integer, nullable=False),
        sa.Column("chunk_count", sa.Integer, nullable=False),
        sa.Column("metadata", _Json, nullable=False),
        sa.Column("root", sa.String(4096), comment=_ROOT_COMMENT),
        *_timestamps(),
    )
    sa.Index("ix_strata_documents_status", documents.c.kb_id, documents.c.status)
    chunks = sa.Table(
        "strata_chunks",
        meta,
        sa.Column("chunk_id", sa.String(64), primary_key=True),
        sa.Column("kb_id", sa.String(256), nullable=False),
        sa.Column("doc_id", sa.String(2048), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("level", sa.Integer, nullable=False),
        sa.Column("parent_id", sa.String(64)),
        sa.Column("root_id", sa.String(64), nullable=False),
        sa.Column("ordinal", sa.Integer, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("heading_path", sa.Text, nullable=False),
        sa.Column("char_start", sa.Integer, nullable=False),
        sa.Column("char_end", sa.Integer, nullable=False),
        sa.Column("child_count", sa.Integer, nullable=False),
        sa.Column("metadata", _Json, nullable=False),
    )
    sa.Index("ix_strata_chunks_doc", chunks.c.kb_id, chunks.c.doc_id, chunks.c.version)
    version_terms = sa.Table(
        "strata_version_terms",
        meta,
        sa.Column("kb_id", sa.String(256), primary_key=True),
        sa.Column("doc_id", sa.String(2048), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column(
            "term", sa.String(64), primary_key=True, comment='a BM25 analyzer token; "" marks the version as counted'
        ),
        sa.Column(
            "leaf_df", sa.Integer, nullable=False, comment="leaves of the version whose search text holds the term"
        ),
    )
    sa.Index("ix_strata_version_terms_term", version_terms.c.kb_id, version_terms.c.term)
    kb_terms = sa.Table(
        "strata_kb_terms",
        meta,
        sa.Column("kb_id", sa.String(256), primary_key=True),
        sa.Column("term", sa.String(64), primary_key=True),
        sa.Column(
            "df",
            sa.Integer,
            nullable=False,
            comment="leaves of the kb's active versions whose search text holds the term",
        ),
    )
    sa.Index("ix_strata_kb_terms_df", kb_terms.c.kb_id, kb_terms.c.df)
    sa.Table(
        "strata_embedding_cache",
        meta,
        sa.Column("encoder", sa.String(512), primary_key=True),
        sa.Column("text_hash", sa.String(64), primary_key=True),
        sa.Column("vector", sa.LargeBinary, nullable=False),
    )
    sa.Table(
        "strata_kb_leases",
        meta,
        sa.Column("kb_id", sa.String(256), primary_key=True),
        sa.Column("owner", sa.String(512), nullable=False, comment="host:pid:token of the indexer holding the kb"),
        sa.Column("acquired_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False, comment="UTC; a holder renews it while it works"),
    )
    return meta


def upgrade() -> None:
    bind = op.get_bind()
    existing = set(sa.inspect(bind).get_table_names())
    if "strata_knowledge_bases" in existing:
        logger.info("adopting the strata tables of a database from before migrations at the baseline")
    _baseline().create_all(bind, checkfirst=True)  # each missing table, with its indexes
    if "strata_documents" in existing:
        columns = {c["name"] for c in sa.inspect(bind).get_columns("strata_documents")}
        if "root" not in columns:  # a table from before that column (what ADDED_COLUMNS used to add)
            op.add_column("strata_documents", sa.Column("root", sa.String(4096), comment=_ROOT_COMMENT))


def downgrade() -> None:
    for table in reversed(_baseline().sorted_tables):
        op.drop_table(table.name)
