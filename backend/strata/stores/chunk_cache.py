"""The chunk cache: chunks (parents, and the leaves retrieval reads) in Redis when configured, an
in-process LRU otherwise.

Keys are namespaced ``{prefix}:{kb}:chunk:{id}``; values are the chunk as
JSON. Batches are one ``MGET`` (read) or one pipeline (write/delete), so a
round of auto-merge costs one cache round trip. Redis errors surface as
``CacheError``; ``CachedChunks`` (``strata.stores.chunk_reads``) decides what
to do with them.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import asdict
from typing import Protocol

import redis
from cachetools import LRUCache

from strata.config import RedisSettings
from strata.errors import CacheError
from strata.stores.redis_client import redis_client
from strata.types import Chunk

ChunkRef = tuple[str, str]  # (kb_id, chunk_id)


class ChunkCache(Protocol):
    """A batch key-value cache of chunks, addressed by (kb id, chunk id)."""

    name: str

    def get_many(self, refs: Sequence[ChunkRef]) -> dict[str, Chunk]: ...

    def put_many(self, items: Sequence[Chunk]) -> None: ...

    def delete_many(self, refs: Sequence[ChunkRef]) -> None: ...

    def delete_kb(self, kb_id: str) -> int: ...

    def keys(self, kb_id: str) -> list[str]: ...

    def close(self) -> None: ...


def encode_chunk(chunk: Chunk) -> str:
    return json.dumps(asdict(chunk), ensure_ascii=False, separators=(",", ":"))


def decode_chunk(raw: str | bytes) -> Chunk:
    return Chunk(**json.loads(raw))


class LocalChunkCache:
    """A bounded, thread-safe in-process LRU (the embedded default)."""

    name = "local"

    def __init__(self, max_entries: int = 20000) -> None:
        self._items: LRUCache[ChunkRef, Chunk] = LRUCache(max_entries)
        self._lock = threading.Lock()

    def get_many(self, refs: Sequence[ChunkRef]) -> dict[str, Chunk]:
        with self._lock:
            return {ref[1]: chunk for ref in refs if (chunk := self._items.get(ref)) is not None}

    def put_many(self, items: Sequence[Chunk]) -> None:
        if self._items.maxsize == 0:  # off: cachetools refuses an entry larger than the cache
            return
        with self._lock:
            for chunk in items:
                self._items[(chunk.kb_id, chunk.chunk_id)] = chunk

    def delete_many(self, refs: Sequence[ChunkRef]) -> None:
        with self._lock:
            for ref in refs:
                self._items.pop(ref, None)

    def delete_kb(self, kb_id: str) -> int:
        with self._lock:
            doomed = [ref for ref in self._items if ref[0] == kb_id]
            for ref in doomed:
                del self._items[ref]
        return len(doomed)

    def keys(self, kb_id: str) -> list[str]:
        """Chunk ids cached for a kb (this process's own cache)."""
        with self._lock:
            return [cid for kb, cid in self._items if kb == kb_id]

    def close(self) -> None:
        pass


class RedisChunkCache:
    """Chunks in Redis with a TTL; short explicit timeouts so an outage costs little."""

    name = "redis"

    def __init__(self, settings: RedisSettings, *, namespace: str = "", client: redis.Redis | None = None) -> None:
        """``namespace`` keeps apart deployments that share a Redis and a key prefix but not a
        database: chunk ids are the same wherever the same document is indexed."""
        self._prefix = f"{settings.key_prefix}:{namespace}" if namespace else settings.key_prefix
        self._ttl = settings.ttl_s
        self._client = client or redis_client(settings)

    def key(self, kb_id: str, chunk_id: str) -> str:
        return f"{self._prefix}:{kb_id}:chunk:{chunk_id}"

    def get_many(self, refs: Sequence[ChunkRef]) -> dict[str, Chunk]:
        if not refs:
            return {}
        try:
            values = self._client.mget([self.key(kb, cid) for kb, cid in refs])
        except redis.RedisError as exc:
            raise CacheError(f"Redis MGET failed: {exc}") from exc
        found: dict[str, Chunk] = {}
        for (_, chunk_id), raw in zip(refs, values):
            if raw is not None:
                found[chunk_id] = decode_chunk(raw)
        return found

    def put_many(self, items: Sequence[Chunk]) -> None:
        if not items:
            return
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for chunk in items:
                    pipe.set(self.key(chunk.kb_id, chunk.chunk_id), encode_chunk(chunk), ex=self._ttl)
                pipe.execute()
        except redis.RedisError as exc:
            raise CacheError(f"Redis write failed: {exc}") from exc

    def delete_many(self, refs: Sequence[ChunkRef]) -> None:
        if not refs:
            return
        try:
            self._client.delete(*[self.key(kb, cid) for kb, cid in refs])
        except redis.RedisError as exc:
            raise CacheError(f"Redis DEL failed: {exc}") from exc

    def delete_kb(self, kb_id: str) -> int:
        """Drops every key of a kb (SCAN + DEL in batches)."""
        removed = 0
        try:
            batch: list[bytes] = []
            pattern = f"{_glob_escape(self._prefix)}:{_glob_escape(kb_id)}:chunk:*"
            for key in self._client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 1000:
                    removed += self._client.delete(*batch)
                    batch = []
            if batch:
                removed += self._client.delete(*batch)
        except redis.RedisError as exc:
            raise CacheError(f"Redis SCAN/DEL failed: {exc}") from exc
        return removed

    def keys(self, kb_id: str) -> list[str]:
        """Chunk ids cached for a kb (SCAN; for ``strata reconcile``)."""
        prefix = f"{self._prefix}:{kb_id}:chunk:"
        try:
            found = self._client.scan_iter(match=f"{_glob_escape(prefix)}*", count=1000)
            return [key.decode()[len(prefix) :] for key in found]
        except redis.RedisError as exc:
            raise CacheError(f"Redis SCAN failed: {exc}") from exc

    def close(self) -> None:
        self._client.close()


def _glob_escape(text: str) -> str:
    """Escapes Redis MATCH pattern characters so a kb id matches only itself."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def create_chunk_cache(settings: RedisSettings, *, namespace: str = "") -> ChunkCache:
    """Redis when ``STRATA_REDIS__URL`` is set (keys under ``{prefix}:{namespace}``), else the in-process LRU."""
    if settings.url:
        return RedisChunkCache(settings, namespace=namespace)
    return LocalChunkCache(settings.local_cache_size)
