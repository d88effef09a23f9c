"""Fair request slots: ``total`` shared by every key, at most ``per_key`` of them held by one key.

A key at its share waits (and, after the queue timeout, gets a 503) without
holding up another key's request queued behind it: a freed slot goes to the
longest-waiting request whose key is under its share, never to one over it.
Slots are handed over on release, so a request that finds a free slot never
jumps ahead of one that was already waiting for it.

Keys are whatever the caller passes (the ``Principal``, hashed by value):
nothing here logs them or turns them into a metric label. ``None`` is a request
without a key (a service without configured keys): it counts against the total
only.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Hashable

from strata.errors import ConfigError

_Waiter = tuple[Hashable, "asyncio.Future[None]"]


class KeySlots:
    """The slots of one server process; create and use it inside one event loop."""

    def __init__(self, total: int, per_key: int) -> None:
        if total < 1 or per_key < 1:  # from the settings (validated there too): a setting, not a request's input
            raise ConfigError(
                "total and per_key must be at least 1 (STRATA_API__MAX_CONCURRENCY, STRATA_API__MAX_CONCURRENCY_PER_KEY)"
            )
        self.total, self.per_key = total, min(per_key, total)
        self._held: Counter[Hashable] = Counter()
        self._in_use = 0
        self._waiters: list[_Waiter] = []

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> int:
        return sum(not waiter.done() for _, waiter in self._waiters)

    def held_by(self, key: Hashable) -> int:
        return self._held[key] if key is not None else 0

    def at_share(self, key: Hashable) -> bool:
        """Whether ``key`` holds all the slots it may (always False for ``None``)."""
        return key is not None and self._held[key] >= self.per_key

    async def acquire(self, key: Hashable, wait_s: float) -> bool:
        """Takes a slot for ``key``, waiting up to ``wait_s``; False when none came in time."""
        if self._fits(key):  # nobody waiting could use this slot: release hands slots over as they free
            self._take(key)
            return True
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (key, waiter)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(waiter, timeout=wait_s)
        except TimeoutError:
            return False
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted as the request was cancelled: give it back
                self.release(key)
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        return True

    def release(self, key: Hashable) -> None:
        """Gives back a slot ``key`` held and hands free slots to the waiters that fit, oldest first."""
        self._in_use -= 1
        if key is not None:
            self._held[key] -= 1
            if not self._held[key]:
                del self._held[key]
        self._hand_over()

    def _hand_over(self) -> None:
        for entry in list(self._waiters):
            if self._in_use >= self.total:
                return
            key, waiter = entry
            if waiter.done():  # timed out or cancelled: acquire removes it
                continue
            if self._fits(key):
                self._take(key)
                self._waiters.remove(entry)
                waiter.set_result(None)

    def _fits(self, key: Hashable) -> bool:
        return self._in_use < self.total and not self.at_share(key)

    def _take(self, key: Hashable) -> None:
        self._in_use += 1
        if key is not None:
            self._held[key] += 1
