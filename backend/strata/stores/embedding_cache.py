"""The SQL embedding cache: passage vectors by (encoder, text hash), so a rebuild encodes only what it lacks."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
from sqlalchemy import select

from strata.stores.sql_database import IN_BATCH, INSERT_BATCH, SqlPart
from strata.stores.sql_schema import embedding_cache


class EmbeddingCache(SqlPart):
    """float32 vectors stored as bytes; a row once written never changes."""

    def cached_embeddings(self, encoder: str, text_hashes: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        hashes = list(dict.fromkeys(text_hashes))
        with self._connect() as conn:
            for start in range(0, len(hashes), IN_BATCH):
                query = select(embedding_cache.c.text_hash, embedding_cache.c.vector).where(
                    embedding_cache.c.encoder == encoder,
                    embedding_cache.c.text_hash.in_(hashes[start : start + IN_BATCH]),
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
            for start in range(0, len(rows), INSERT_BATCH):
                batch = rows[start : start + INSERT_BATCH]
                conn.execute(self._db.insert(embedding_cache).values(batch).on_conflict_do_nothing())
