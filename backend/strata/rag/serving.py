"""The last serving state a process saw: reused while the kbs' generations stand, and so an SQL
outage fails closed.

A query first reads the kbs' generations (one small query); the serving state
(the versions not to serve, a join over every document) is read again only
when a generation moved, since every change to what may be served bumps it.

Without SQL a query cannot know which document versions are pending or
retired. Rather than serve them, retrieval uses the last state it read for
the same knowledge bases (reported as ``serving_state_stale``), and without
one it fails with the reason.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from cachetools import LRUCache

from strata.types import ServingState


class LastServingStates:
    """The most recent ``ServingState`` per set of kb ids (None = all kbs); the least recently used go first."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._states: LRUCache[tuple[str, ...] | None, ServingState] = LRUCache(max_entries)
        self._lock = threading.Lock()

    def remember(self, kb_ids: Sequence[str] | None, state: ServingState) -> None:
        with self._lock:
            self._states[_key(kb_ids)] = state

    def get(self, kb_ids: Sequence[str] | None) -> ServingState | None:
        with self._lock:
            return self._states.get(_key(kb_ids))


def _key(kb_ids: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if kb_ids is None else tuple(sorted(set(kb_ids)))
