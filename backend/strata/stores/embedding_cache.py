"""The SQL embedding cache: passage vectors by (kb, encoder, text hash), so a rebuild encodes only what it lacks.

A kb reuses only the vectors it encoded itself: a shared cache would let a
write key learn, from its upload's report (or its duration), whether another
kb holds a text. ``drop_kb`` deletes the kb's rows with the kb; ``strata
reconcile --repair`` deletes those no served leaf uses (``drop_embeddings``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from sqlalchemy import delete, select

from strata.stores.sql_database import IN_BATCH, INSERT_BATCH, SqlPart
from strata.stores.sql_schema import kb_embeddings


class EmbeddingCache(SqlPart):
    """float32 vectors stored as bytes; a row once written never changes."""

    def cached_embeddings(self, kb_id: str, encoder: str, text_hashes: Sequence[str]) -> dict[str, np.ndarray]:
        """The vectors ``kb_id`` cached for ``text_hashes`` with ``encoder`` (never another kb's)."""
        found: dict[str, np.ndarray] = {}
        hashes = list(dict.fromkeys(text_hashes))
        table = kb_embeddings
        with self._connect() as conn:
            for start in range(0, len(hashes), IN_BATCH):
                query = select(table.c.text_hash, table.c.vector).where(
                    table.c.kb_id == kb_id,
                    table.c.encoder == encoder,
                    table.c.text_hash.in_(hashes[start : start + IN_BATCH]),
                )
                for text_hash, blob in conn.execute(query):
                    found[text_hash] = np.frombuffer(blob, dtype=np.float32)
        return found

    def cache_embeddings(self, kb_id: str, encoder: str, vectors: Mapping[str, np.ndarray]) -> None:
        if not vectors:
            return
        rows = [
            {"kb_id": kb_id, "encoder": encoder, "text_hash": h, "vector": np.asarray(v, dtype=np.float32).tobytes()}
            for h, v in vectors.items()
        ]
        with self._begin() as conn:
            for start in range(0, len(rows), INSERT_BATCH):
                batch = rows[start : start + INSERT_BATCH]
                conn.execute(self._db.insert(kb_embeddings).values(batch).on_conflict_do_nothing())

    def cached_keys(self, kb_id: str) -> set[tuple[str, str]]:
        """Every (encoder, text hash) the kb has a vector for (no vector read)."""
        query = select(kb_embeddings.c.encoder, kb_embeddings.c.text_hash).where(kb_embeddings.c.kb_id == kb_id)
        with self._connect() as conn:
            return {(row.encoder, row.text_hash) for row in conn.execute(query)}

    def drop_embeddings(self, kb_id: str, keys: Sequence[tuple[str, str]]) -> None:
        """Deletes the kb's vectors of these (encoder, text hash) keys, a batch per statement."""
        table = kb_embeddings
        by_encoder: dict[str, list[str]] = {}
        for encoder, text_hash in keys:
            by_encoder.setdefault(encoder, []).append(text_hash)
        with self._begin() as conn:
            for encoder, hashes in by_encoder.items():
                for start in range(0, len(hashes), IN_BATCH):
                    batch = hashes[start : start + IN_BATCH]
                    conn.execute(
                        delete(table).where(
                            table.c.kb_id == kb_id, table.c.encoder == encoder, table.c.text_hash.in_(batch)
                        )
                    )
