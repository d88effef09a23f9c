"""Knowledge bases in SQL: their encoder, chunking and serving generation.

A kb's row says which encoder built it (a query with another is refused) and
carries its serving state: ``created_at`` is the kb's epoch and ``generation``
is bumped by every change of what it serves, so "epoch#generation" keys the
query cache. ``serving_state`` adds the versions not to serve, in one query.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.engine import Connection

from strata.errors import EncoderMismatchError
from strata.stores.keys import version_key
from strata.stores.sql_database import SqlPart
from strata.stores.sql_schema import chunks, documents, kb_embeddings, kb_terms, knowledge_bases, version_terms
from strata.types import ACTIVE, KnowledgeBase, ServingState


class KnowledgeBases(SqlPart):
    """The kb rows: created once per encoder, dropped with everything they hold."""

    def ensure_kb(self, kb_id: str, *, encoder: str, dim: int, chunking: str) -> KnowledgeBase:
        """The kb row, created if missing; refuses a kb built with another encoder."""
        with self._begin() as conn:
            row = conn.execute(select(knowledge_bases).where(knowledge_bases.c.kb_id == kb_id)).first()
            if row is None:
                # created_at to the microsecond is the kb's epoch: a kb created anew never repeats a cache key
                values = {
                    "kb_id": kb_id,
                    "encoder": encoder,
                    "dim": dim,
                    "chunking": chunking,
                    "generation": 0,
                    "created_at": _now(),
                }
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
            conn.execute(
                update(knowledge_bases).where(knowledge_bases.c.kb_id == kb_id).values(encoder=encoder, dim=dim)
            )

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
            for table in (kb_embeddings, kb_terms, version_terms, chunks, documents, knowledge_bases):
                conn.execute(delete(table).where(table.c.kb_id == kb_id))

    def generations(self, kb_ids: Sequence[str] | None, *, timeout_s: float | None = None) -> dict[str, str]:
        """Each kb's "epoch#generation": what changes whenever its serving state does (one small query)."""
        kb = knowledge_bases
        query = select(kb.c.kb_id, kb.c.generation, kb.c.created_at)
        if kb_ids is not None:
            query = query.where(kb.c.kb_id.in_(list(kb_ids)))
        with self._query_path(timeout_s) as conn:
            return {r.kb_id: _generation(r) for r in conn.execute(query)}

    def serving_state(self, kb_ids: Sequence[str] | None, *, timeout_s: float | None = None) -> ServingState:
        """Each kb's (epoch, generation) and the versions not to serve (one query), and the leaves of its
        active versions (another).

        Runs under the query-path statement timeout (``STRATA_DATABASE__QUERY_TIMEOUT_S``).
        """
        kb = knowledge_bases
        query = select(kb.c.kb_id, kb.c.generation, kb.c.created_at, documents.c.doc_id, documents.c.version).outerjoin(
            documents, and_(documents.c.kb_id == kb.c.kb_id, documents.c.status != ACTIVE)
        )
        if kb_ids is not None:
            query = query.where(kb.c.kb_id.in_(list(kb_ids)))
        served = select(documents.c.kb_id, func.sum(documents.c.leaf_count)).where(documents.c.status == ACTIVE)
        if kb_ids is not None:
            served = served.where(documents.c.kb_id.in_(list(kb_ids)))
        with self._query_path(timeout_s) as conn:
            rows = conn.execute(query).all()
            leaves = {kb_id: int(n or 0) for kb_id, n in conn.execute(served.group_by(documents.c.kb_id))}
        generations = {r.kb_id: _generation(r) for r in rows}
        hidden = tuple(version_key(r.kb_id, r.doc_id, r.version) for r in rows if r.doc_id is not None)
        return ServingState(generations=generations, hidden_version_keys=hidden, served_leaves=leaves)


def bump_generation(conn: Connection, kb_id: str) -> None:
    """The kb's serving state changed (in ``conn``'s transaction): its cache keys change with it."""
    conn.execute(
        update(knowledge_bases)
        .where(knowledge_bases.c.kb_id == kb_id)
        .values(generation=knowledge_bases.c.generation + 1)
    )


def _kb(row: Any) -> KnowledgeBase:
    return KnowledgeBase(row.kb_id, row.encoder, row.dim, row.chunking, row.generation, _epoch(row.created_at))


def _now() -> datetime:
    return datetime.now(UTC)


def _generation(row: Any) -> str:
    """A kb's "epoch#generation" from its row: a kb dropped and created again starts a new epoch."""
    return f"{_epoch(row.created_at)}#{row.generation}"


def _epoch(created_at: datetime | None) -> str:
    if created_at is None:
        return ""
    if created_at.tzinfo is not None:  # PostgreSQL answers in the session's time zone
        created_at = created_at.astimezone(UTC).replace(tzinfo=None)
    return created_at.isoformat()
