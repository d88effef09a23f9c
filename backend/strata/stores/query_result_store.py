"""Serialized query results in Redis, shared by every process of a deployment.

Only the I/O lives here: what is cached and for how long is the query
cache's policy (``strata.rag.query_cache``). Redis errors surface as
``CacheError``.
"""

from __future__ import annotations

from typing import cast

import redis

from strata.config import RedisSettings
from strata.errors import CacheError
from strata.stores.redis_client import redis_client


class RedisResultStore:
    """``GET``/``SET`` of result blobs under ``{prefix}:qcache:{key}`` with short timeouts."""

    def __init__(self, settings: RedisSettings) -> None:
        self._prefix = f"{settings.key_prefix}:qcache:"
        self._client = redis_client(settings)

    def get(self, key: str) -> bytes | None:
        try:
            return cast(bytes | None, self._client.get(self._prefix + key))  # a client without decode_responses
        except redis.RedisError as exc:
            raise CacheError(f"Redis GET of a cached result failed: {exc}") from exc

    def set(self, key: str, blob: str, *, ttl_s: int) -> None:
        try:
            self._client.set(self._prefix + key, blob, ex=ttl_s)
        except redis.RedisError as exc:
            raise CacheError(f"Redis SET of a cached result failed: {exc}") from exc

    def close(self) -> None:
        self._client.close()
