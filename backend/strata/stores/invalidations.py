"""Parent-cache invalidations that failed, recorded in SQL until they succeed.

Removing a version deletes its chunks' cache entries; when the cache is down
(Redis stopped or paused) the entries stay and the deletion is recorded here,
to be retried by the kb's next indexing run, delete, or ``strata reconcile
--repair`` (and counted by ``strata reconcile``). Version numbers never repeat
(``strata_version_marks``), so such an entry is never read as a newer
version's chunk meanwhile; recording it bounds how long it occupies the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select

from strata.stores.sql_database import INSERT_BATCH, SqlPart
from strata.stores.sql_schema import cache_invalidations


class CacheInvalidations(SqlPart):
    """Cache entries (kb id, chunk id) still to be deleted."""

    def record_invalidations(self, kb_id: str, chunk_ids: Sequence[str]) -> None:
        """Records entries whose deletion failed (already recorded ones are kept once)."""
        wanted = list(dict.fromkeys(chunk_ids))
        with self._begin() as conn:
            for start in range(0, len(wanted), INSERT_BATCH):
                rows = [{"kb_id": kb_id, "chunk_id": cid} for cid in wanted[start : start + INSERT_BATCH]]
                conn.execute(self._db.insert(cache_invalidations).on_conflict_do_nothing(), rows)

    def pending_invalidations(self, kb_id: str) -> list[str]:
        """Chunk ids of the kb whose cache entries are still to be deleted."""
        query = select(cache_invalidations.c.chunk_id).where(cache_invalidations.c.kb_id == kb_id)
        with self._connect() as conn:
            return list(conn.execute(query.order_by(cache_invalidations.c.chunk_id)).scalars())

    def count_invalidations(self, kb_id: str) -> int:
        query = select(func.count()).select_from(cache_invalidations).where(cache_invalidations.c.kb_id == kb_id)
        with self._connect() as conn:
            return int(conn.execute(query).scalar() or 0)

    def clear_invalidations(self, kb_id: str, chunk_ids: Sequence[str]) -> None:
        """Forgets entries that were deleted."""
        table = cache_invalidations
        with self._begin() as conn:
            for start in range(0, len(chunk_ids), INSERT_BATCH):
                batch = list(chunk_ids[start : start + INSERT_BATCH])
                conn.execute(delete(table).where(table.c.kb_id == kb_id, table.c.chunk_id.in_(batch)))
