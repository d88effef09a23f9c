"""Chunks read through the chunk cache: cache first, SQL for the misses.

``CachedChunks`` serves the chunk texts retrieval reads (the candidates'
leaves, the parents they merge into) and takes the parents indexing writes
through. One ``get_many`` is one batched cache read, at most one batched SQL
read for the misses, and a cache backfill. A failing cache (Redis down or
hanging) is logged, counted and bypassed for ``STRATA_REDIS__RETRY_AFTER_S``:
SQL answers and the caller learns about it from ``ChunkFetch.cache_error``;
nothing is raised.
The bypass is the deployment's one ``RedisBreaker``, shared with the query
cache: an outage either of them meets, both skip.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from strata.config import RedisSettings
from strata.errors import CacheError
from strata.stores.chunk_cache import ChunkCache, ChunkRef
from strata.stores.redis_client import RedisBreaker
from strata.types import Chunk

logger = logging.getLogger(__name__)


class ChunkRows(Protocol):
    """The SQL rows of chunks, their source of truth (``DocumentStore.chunks``)."""

    def get_chunks(self, chunk_ids: Iterable[str], *, timeout_s: float | None = None) -> dict[str, Chunk]: ...


@dataclass(frozen=True)
class ChunkFetch:
    """The chunks found and what it cost."""

    chunks: Mapping[str, Chunk] = field(default_factory=dict)
    cache_hits: int = 0
    cache_misses: int = 0
    cache_round_trips: int = 0
    sql_queries: int = 0
    cache_error: str | None = None
    missing: tuple[str, ...] = ()


class CachedChunks:
    """Chunks by (kb id, chunk id): cache, then SQL, then backfill."""

    def __init__(self, cache: ChunkCache, rows: ChunkRows, *, breaker: RedisBreaker | None = None) -> None:
        """``breaker`` is the deployment's Redis breaker (default: one of this store's own)."""
        self.cache = cache
        self._rows = rows
        self._breaker = breaker or RedisBreaker.from_settings(RedisSettings())
        self._lock = threading.Lock()
        self.cache_errors = 0

    def get_many(self, refs: Sequence[ChunkRef], *, timeout_s: float | None = None) -> ChunkFetch:
        """The chunks named by ``refs``; SQL errors propagate as ``StoreError`` (``timeout_s`` bounds the SQL read)."""
        refs = list(dict.fromkeys(refs))
        if not refs:
            return ChunkFetch()
        cached, error, trips = self._cache_read(refs)
        misses = [ref for ref in refs if ref[1] not in cached]
        loaded = self._rows.get_chunks([cid for _, cid in misses], timeout_s=timeout_s) if misses else {}
        if loaded and error is None:
            error = self._cache_call(self.cache.put_many, list(loaded.values()))
        found = {**cached, **loaded}
        return ChunkFetch(
            chunks=found,
            cache_hits=len(cached),
            cache_misses=len(misses),
            cache_round_trips=trips,
            sql_queries=1 if misses else 0,
            cache_error=error,
            missing=tuple(cid for _, cid in refs if cid not in found),
        )

    @property
    def in_process(self) -> bool:
        """True for the in-process LRU (the embedded default), which only this process fills."""
        return self.cache.name == "local"

    def put_many(self, chunks: Sequence[Chunk]) -> str | None:
        """Write-through at indexing time; returns the cache error, if any."""
        return self._cache_call(self.cache.put_many, list(chunks))

    def close(self) -> None:
        self.cache.close()

    def invalidate(self, refs: Sequence[ChunkRef]) -> str | None:
        return self._cache_call(self.cache.delete_many, list(refs))

    def _cache_read(self, refs: list[ChunkRef]) -> tuple[dict[str, Chunk], str | None, int]:
        if self._bypassing():
            return {}, f"{self.cache.name} cache bypassed after a recent error", 0
        try:
            return self.cache.get_many(refs), None, 1
        except CacheError as exc:
            return {}, self._record_failure(exc), 1

    def _cache_call(self, method: object, arg: object) -> str | None:
        if self._bypassing():
            return f"{self.cache.name} cache bypassed after a recent error"
        try:
            method(arg)  # type: ignore[operator]
            return None
        except CacheError as exc:
            return self._record_failure(exc)

    def _bypassing(self) -> bool:
        return self._breaker.is_open

    def _record_failure(self, exc: CacheError) -> str:
        with self._lock:
            self.cache_errors += 1
        self._breaker.trip()
        logger.warning("parent cache failed, serving from SQL for %.0fs: %s", self._breaker.retry_after_s, exc)
        return str(exc)
