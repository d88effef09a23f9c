"""Redis, one way: the client every Redis user builds, and the breaker they share.

Both users of Redis (the chunk cache, ``stores.chunk_cache``, and the query-result
store, ``stores.query_result_store``) get their client from ``redis_client``: the
timeouts of ``RedisSettings`` and no retries inside redis-py, so a paused
Redis costs one socket timeout. What happens next is the breaker's call, not a
retry loop's: ``RedisBreaker`` opens on an error and stays open
``STRATA_REDIS__RETRY_AFTER_S``. ``Resources`` builds one breaker and hands it
to both users, so an outage one of them meets the other skips too.
"""

from __future__ import annotations

import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from strata.config import RedisSettings
from strata.errors import ConfigError


def redis_client(settings: RedisSettings) -> redis.Redis:
    """A client (and its connection pool) for ``settings.url`` with short, explicit timeouts and no retries."""
    if not settings.url:
        raise ConfigError("redis_client needs STRATA_REDIS__URL")
    return redis.Redis.from_url(
        str(settings.url),
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=settings.socket_timeout_s,
        retry=Retry(NoBackoff(), 0),  # retries live in one layer: the breaker
        health_check_interval=0,
    )


class RedisBreaker:
    """Open for ``retry_after_s`` after a Redis error: while open, callers skip Redis."""

    def __init__(self, retry_after_s: float) -> None:
        self.retry_after_s = retry_after_s
        self._open_until = 0.0

    @classmethod
    def from_settings(cls, settings: RedisSettings) -> RedisBreaker:
        return cls(settings.retry_after_s)

    @property
    def is_open(self) -> bool:
        return time.monotonic() < self._open_until

    def trip(self) -> None:
        """Records an error: Redis is skipped for the next ``retry_after_s``."""
        self._open_until = time.monotonic() + self.retry_after_s
