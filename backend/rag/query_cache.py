"""The query-result cache: an in-process LRU with TTL, plus Redis when configured.

Keys cover everything that decides a result: the normalized query, top_k,
kb ids, filters, the retrieval settings and each kb's generation (bumped by
every indexing change), so an index change invalidates a kb's entries
without a scan. Concurrent identical misses compute once (single flight).
Only ``status == "ok"`` results are stored: a degraded answer is not reused.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import unicodedata
from collections import OrderedDict
from typing import Any, Callable, Mapping

import redis

from backend.config import RedisSettings

logger = logging.getLogger(__name__)


def normalize_query(query: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", query).split()).lower()


def cache_key(parts: Mapping[str, Any]) -> str:
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:40]


class QueryCache:
    """LRU (+ optional Redis) of serialized results with single-flight misses."""

    def __init__(self, *, size: int, ttl_s: float, redis_settings: RedisSettings | None = None) -> None:
        self._size = size
        self._ttl = ttl_s
        self._items: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self._lock = threading.Lock()
        self._inflight: dict[str, threading.Event] = {}
        self._redis = None
        self._prefix = ""
        if redis_settings is not None and redis_settings.url:
            self._prefix = f"{redis_settings.key_prefix}:qcache:"
            self._redis = redis.Redis.from_url(
                str(redis_settings.url),
                socket_connect_timeout=redis_settings.connect_timeout_s,
                socket_timeout=redis_settings.socket_timeout_s,
            )

    @property
    def enabled(self) -> bool:
        return self._size > 0

    def get_or_compute(
        self, key: str, compute: Callable[[], tuple[dict[str, Any], bool]]
    ) -> tuple[dict[str, Any], bool]:
        """(value, hit). ``compute`` returns (value, cacheable); one caller computes per key."""
        while True:
            found = self._get(key)
            if found is not None:
                return found, True
            with self._lock:
                event = self._inflight.get(key)
                if event is None:
                    self._inflight[key] = threading.Event()
                    break
            event.wait(timeout=60)
        try:
            value, cacheable = compute()
            if cacheable:
                self._put(key, value)
            return value, False
        finally:
            with self._lock:
                self._inflight.pop(key).set()

    def _get(self, key: str) -> dict[str, Any] | None:
        now = time.monotonic()
        with self._lock:
            entry = self._items.get(key)
            if entry and entry[0] > now:
                self._items.move_to_end(key)
                return entry[1]
            if entry:
                del self._items[key]
        return self._redis_get(key)

    def _put(self, key: str, value: dict[str, Any]) -> None:
        self._remember(key, value)
        if self._redis is not None:
            try:
                self._redis.set(self._prefix + key, json.dumps(value, ensure_ascii=False), ex=int(self._ttl))
            except redis.RedisError as exc:
                logger.warning("query cache: Redis write failed: %s", exc)

    def _redis_get(self, key: str) -> dict[str, Any] | None:
        if self._redis is None:
            return None
        try:
            raw = self._redis.get(self._prefix + key)
        except redis.RedisError as exc:
            logger.warning("query cache: Redis read failed: %s", exc)
            return None
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError as exc:  # a corrupt entry is a miss, not an error
            logger.warning("query cache: unreadable Redis entry %s: %s", key, exc)
            return None
        self._remember(key, value)
        return value

    def _remember(self, key: str, value: dict[str, Any]) -> None:
        """Stores ``key`` locally as the most recent entry, evicting the least recent past ``size``."""
        with self._lock:
            self._items[key] = (time.monotonic() + self._ttl, value)
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
