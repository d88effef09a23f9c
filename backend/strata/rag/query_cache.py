"""The query-result cache policy: an in-process LRU with TTL, plus Redis when configured.

Keys cover everything that decides a result (the caller builds them with
``cache_key``): the normalized query, top_k, kb ids, filters, the retrieval,
chunking and rerank settings, the stores' identity and each kb's epoch and
generation (bumped by every indexing change), so an index change
invalidates a kb's entries without a scan.

- Concurrent identical misses compute once (single flight); the waiters
  share the leader's result whatever its status.
- Only results the caller marks cacheable (``status == "ok"``) are stored.
- A Redis error costs one socket timeout, then Redis is skipped while the
  deployment's ``RedisBreaker`` is open (``STRATA_REDIS__RETRY_AFTER_S``, the
  same breaker the parent store trips); the error is handed back so the meta
  record shows it.
- An entry that does not decode is a miss. Every result handed out is a
  private copy: a caller that edits one cannot corrupt the cache.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from cachetools import TTLCache

from strata.config import RedisSettings
from strata.errors import CacheError
from strata.stores.query_result_store import RedisResultStore
from strata.stores.redis_client import RedisBreaker

logger = logging.getLogger(__name__)

Source = Literal["hit", "miss", "shared"]


def normalize_query(query: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", query).split()).lower()


def cache_key(parts: Mapping[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:40]


@dataclass(frozen=True)
class Lookup:
    """A result and where it came from: the cache (``hit``), this call (``miss``) or a concurrent call (``shared``)."""

    value: dict[str, Any]
    source: Source
    cache_error: str | None = None


FOLLOW_WAIT_S = 60.0  # the longest a call waits for an identical one in flight


class _Flight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: dict[str, Any] | None = None


class QueryCache:
    """LRU (+ optional Redis) of serialized results with single-flight misses."""

    def __init__(
        self,
        *,
        size: int,
        ttl_s: float,
        redis_settings: RedisSettings | None = None,
        breaker: RedisBreaker | None = None,
        decodes: Callable[[dict[str, Any]], bool] = lambda value: True,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """``breaker`` is the deployment's Redis breaker (default: one of this cache's own, from ``redis_settings``);
        ``decodes`` tells whether a value read back from Redis is usable (one that is not is a miss);
        ``timer`` is the clock of the local entries' TTL."""
        self._decodes = decodes
        self._ttl = ttl_s
        self._items: TTLCache[str, dict[str, Any]] = TTLCache(size, ttl_s, timer=timer)
        self._lock = threading.Lock()
        self._inflight: dict[str, _Flight] = {}
        self._redis = RedisResultStore(redis_settings) if redis_settings is not None and redis_settings.url else None
        self._breaker = breaker or RedisBreaker.from_settings(redis_settings or RedisSettings())

    @property
    def enabled(self) -> bool:
        return self._items.maxsize > 0

    def get_or_compute(
        self, key: str, compute: Callable[[], tuple[dict[str, Any], bool]], *, wait_s: float = FOLLOW_WAIT_S
    ) -> Lookup:
        """The cached value of ``key``, or ``compute()``'s (value, cacheable), computed once per key at a time.

        A call that finds the same key in flight waits for it at most ``wait_s`` (the caller's deadline), then
        computes itself: a query with a short deadline never waits out a longer one's run."""
        found, error = self._get(key)
        if found is not None:
            return Lookup(copy.deepcopy(found), "hit", error)
        with self._lock:
            flight = self._inflight.get(key)
            leader = flight is None
            if leader:
                flight = self._inflight[key] = _Flight()
        assert flight is not None  # set above, under the lock
        if not leader:
            flight.done.wait(timeout=min(wait_s, FOLLOW_WAIT_S))
            if flight.value is not None:
                return Lookup(copy.deepcopy(flight.value), "shared", error)
            return self._compute(key, compute, error)  # the leader died without a result, or is still running
        try:
            return self._compute(key, compute, error, flight)
        finally:
            with self._lock:
                self._inflight.pop(key, None)
            flight.done.set()

    def _compute(
        self,
        key: str,
        compute: Callable[[], tuple[dict[str, Any], bool]],
        error: str | None,
        flight: _Flight | None = None,
    ) -> Lookup:
        value, cacheable = compute()
        if flight is not None:
            flight.value = copy.deepcopy(value)
        if cacheable:
            error = self._put(key, copy.deepcopy(value)) or error
        return Lookup(value, "miss", error)

    def _get(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        with self._lock:
            found = self._items.get(key)
        if found is not None:
            return found, None
        return self._redis_get(key)

    def _put(self, key: str, value: dict[str, Any]) -> str | None:
        self._remember(key, value)
        if self._redis is None or self._bypassing():
            return None
        try:
            self._redis.set(key, json.dumps(value, ensure_ascii=False), ttl_s=int(self._ttl))
        except CacheError as exc:
            return self._redis_failed(exc)
        return None

    def _redis_get(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        if self._redis is None:
            return None, None
        if self._bypassing():
            return None, "Redis query cache bypassed after a recent error"
        try:
            raw = self._redis.get(key)
        except CacheError as exc:
            return None, self._redis_failed(exc)
        if raw is None:
            return None, None
        try:
            value = json.loads(raw)
        except ValueError as exc:  # a corrupt entry is a miss, not an error
            logger.warning("query cache: unreadable Redis entry %s: %s", key, exc)
            return None, None
        if not isinstance(value, dict) or not self._decodes(value):
            logger.warning("query cache: Redis entry %s does not decode to a result; treated as a miss", key)
            return None, None
        self._remember(key, value)
        return value, None

    def _bypassing(self) -> bool:
        return self._breaker.is_open

    def _redis_failed(self, exc: CacheError) -> str:
        self._breaker.trip()
        logger.warning("query cache: Redis failed, skipping it for %.0fs: %s", self._breaker.retry_after_s, exc)
        return str(exc)

    def _remember(self, key: str, value: dict[str, Any]) -> None:
        """Stores ``key`` locally as the most recent entry, evicting the least recent past ``size``."""
        if self.enabled:  # cachetools refuses an entry larger than the cache
            with self._lock:
                self._items[key] = value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
