"""Version marks and recorded cache invalidations: a document's version numbers never repeat.

``strata_version_marks`` keeps the highest version each (kb, document) ever
activated, so a document deleted and indexed again gets a new version, hence new
chunk ids, and a parent-cache entry left by the deleted one is never read as
the new one. Existing documents start at their highest stored version.
``strata_cache_invalidations`` records cache entries whose invalidation failed
(Redis down during a delete or a retire), for the next run or
``strata reconcile --repair`` to delete.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
# Expand: two new tables that code at 0002 never reads. While such code indexes, it records no marks, so a
# document it deletes and that is indexed again may get a version number again (0002's behaviour).
compatible_with = "0002"
lossy_downgrade = "drops the version marks of deleted documents and the cache invalidations still to do"

_MARK_COMMENT = "highest version of the document ever activated; outlives its deletion"


def upgrade() -> None:
    marks = op.create_table(
        "strata_version_marks",
        sa.Column("kb_id", sa.String(256), primary_key=True),
        sa.Column("doc_id", sa.String(2048), primary_key=True),
        sa.Column("last_version", sa.Integer, nullable=False, comment=_MARK_COMMENT),
    )
    op.create_table(
        "strata_cache_invalidations",
        sa.Column("kb_id", sa.String(256), primary_key=True),
        sa.Column("chunk_id", sa.String(64), primary_key=True),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    documents = sa.table("strata_documents", sa.column("kb_id"), sa.column("doc_id"), sa.column("version"))
    highest = sa.select(documents.c.kb_id, documents.c.doc_id, sa.func.max(documents.c.version)).group_by(
        documents.c.kb_id, documents.c.doc_id
    )
    op.execute(marks.insert().from_select(["kb_id", "doc_id", "last_version"], highest))


def downgrade() -> None:
    op.drop_table("strata_cache_invalidations")
    op.drop_table("strata_version_marks")
