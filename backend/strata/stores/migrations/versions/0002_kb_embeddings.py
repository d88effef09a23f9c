"""The embedding cache per kb: ``strata_kb_embeddings`` (kb_id, encoder, text_hash) replaces ``strata_embedding_cache``.

The shared cache let one kb's upload report (and its duration) show whether
another kb held a text. Each kb keeps the cached vectors of its own leaves
(a leaf's text hash with and without its heading path, since either
``contextualize`` setting may have written it, with the kb's encoder); the
rest of the shared cache is dropped: a kb that needs such a text encodes it.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-08
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql, sqlite

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
compatible_with = None  # contract: code at 0001 reads and writes strata_embedding_cache, which this drops
lossy_downgrade = None  # the shared cache gets every vector back (one per encoder and text: the same vector)

logger = logging.getLogger("strata.stores.migrations")
_BATCH = 400  # leaves per page: at most 800 hashes in one IN (...), under SQLite's variable limit
_LEAF_LEVEL = 3

_shared = sa.table(
    "strata_embedding_cache",
    sa.column("encoder", sa.String),
    sa.column("text_hash", sa.String),
    sa.column("vector", sa.LargeBinary),
)
_chunks = sa.table(
    "strata_chunks",
    sa.column("chunk_id", sa.String),
    sa.column("kb_id", sa.String),
    sa.column("level", sa.Integer),
    sa.column("text", sa.Text),
    sa.column("heading_path", sa.Text),
)
_kbs = sa.table("strata_knowledge_bases", sa.column("kb_id", sa.String), sa.column("encoder", sa.String))


def upgrade() -> None:
    per_kb = op.create_table(
        "strata_kb_embeddings",
        sa.Column(
            "kb_id", sa.String(256), primary_key=True, comment="a vector is reused only by the kb that encoded it"
        ),
        sa.Column("encoder", sa.String(512), primary_key=True),
        sa.Column("text_hash", sa.String(64), primary_key=True),
        sa.Column("vector", sa.LargeBinary, nullable=False),
    )
    bind = op.get_bind()
    insert = (postgresql.insert if bind.dialect.name == "postgresql" else sqlite.insert)(per_kb)
    kept = 0
    for kb_id, encoder in bind.execute(sa.select(_kbs.c.kb_id, _kbs.c.encoder)).all():
        for hashes in _leaf_hash_batches(bind, kb_id):
            query = sa.select(_shared.c.text_hash, _shared.c.vector).where(
                _shared.c.encoder == encoder, _shared.c.text_hash.in_(hashes)
            )
            rows = [{"kb_id": kb_id, "encoder": encoder, "text_hash": h, "vector": v} for h, v in bind.execute(query)]
            if rows:  # a text two leaves share comes again in a later batch: kept once
                bind.execute(insert.on_conflict_do_nothing(), rows)
                kept += len(rows)
    if kept:
        logger.info("kept %d cached vectors, each for the kb whose leaf it is", kept)
    op.drop_table("strata_embedding_cache")


def _leaf_hash_batches(bind: sa.Connection, kb_id: str) -> Iterator[list[str]]:
    """The hashes a kb's leaves' search texts had (its text, and its heading path + text: ``contextualize``), a
    page of ``_BATCH`` leaves at a time by chunk id, so memory stays flat however large the kb."""
    after = ""
    while True:
        query = (
            sa.select(_chunks.c.chunk_id, _chunks.c.text, _chunks.c.heading_path)
            .where(_chunks.c.kb_id == kb_id, _chunks.c.level == _LEAF_LEVEL, _chunks.c.chunk_id > after)
            .order_by(_chunks.c.chunk_id)
            .limit(_BATCH)
        )
        page = bind.execute(query).all()
        if not page:
            return
        hashes = {hashlib.sha256(text.encode("utf-8")).hexdigest() for _, text, _ in page}
        hashes |= {hashlib.sha256(f"{path}\n{text}".encode()).hexdigest() for _, text, path in page if path}
        yield sorted(hashes)
        after = page[-1].chunk_id


def downgrade() -> None:
    op.create_table(
        "strata_embedding_cache",
        sa.Column("encoder", sa.String(512), primary_key=True),
        sa.Column("text_hash", sa.String(64), primary_key=True),
        sa.Column("vector", sa.LargeBinary, nullable=False),
    )
    op.execute(
        "INSERT INTO strata_embedding_cache (encoder, text_hash, vector) "
        "SELECT e.encoder, e.text_hash, e.vector FROM strata_kb_embeddings e WHERE e.kb_id = ("
        "SELECT MIN(m.kb_id) FROM strata_kb_embeddings m WHERE m.encoder = e.encoder AND m.text_hash = e.text_hash)"
    )
    op.drop_table("strata_kb_embeddings")
