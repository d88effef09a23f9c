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

With ``shared`` slots (``strata serve --workers N``: ``shared_slots.FileSlots``) a key's share holds across
the worker processes: a request that has its process's slot also takes one of the key's ``per_key`` slots
shared by every worker, waiting for one (polled every ``SHARED_POLL_S``) within the same ``wait_s``. The
total stays each process's own: it is that process's capacity (its threads), which more workers do add.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter, defaultdict
from collections.abc import Hashable

from strata.api.shared_slots import Held, Slots
from strata.errors import ConfigError

SHARED_POLL_S = 0.02  # how soon a key's slot freed in another worker is seen by a request waiting here

_Waiter = tuple[Hashable, "asyncio.Future[None]"]


class KeySlots:
    """The slots of one server process; create and use it inside one event loop."""

    def __init__(self, total: int, per_key: int, shared: Slots | None = None) -> None:
        if total < 1 or per_key < 1:  # from the settings (validated there too): a setting, not a request's input
            raise ConfigError(
                "total and per_key must be at least 1 (STRATA_API__MAX_CONCURRENCY, STRATA_API__MAX_CONCURRENCY_PER_KEY)"
            )
        self.total, self.per_key = total, min(per_key, total)
        self.shared = shared
        self._held: Counter[Hashable] = Counter()
        self._shared_held: defaultdict[Hashable, list[Held]] = defaultdict(list)
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
        """Whether ``key`` holds all the slots it may, in this process or across the shared ones (always False
        for ``None``)."""
        if key is None:
            return False
        if self._held[key] >= self.per_key:
            return True
        if self.shared is None:
            return False
        probe = self.shared.take(group_of(key), self.per_key)
        if probe is not None:
            self.shared.release(probe)
        return probe is None

    async def acquire(self, key: Hashable, wait_s: float) -> bool:
        """Takes a slot for ``key`` (and, with ``shared``, one of its shared ones), waiting up to ``wait_s``;
        False when none came in time."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        if not await self._acquire_here(key, wait_s):
            return False
        if self.shared is None or key is None:
            return True
        try:
            while (held := self.shared.take(group_of(key), self.per_key)) is None:
                left = deadline - loop.time()
                if left <= 0:
                    self._release_here(key)
                    return False
                await asyncio.sleep(min(SHARED_POLL_S, left))
        except BaseException:  # cancelled while waiting: the process's slot goes back
            self._release_here(key)
            raise
        self._shared_held[key].append(held)
        return True

    async def _acquire_here(self, key: Hashable, wait_s: float) -> bool:
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
                self._release_here(key)
            raise
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)
        return True

    def release(self, key: Hashable) -> None:
        """Gives back a slot ``key`` held and hands free slots to the waiters that fit, oldest first."""
        shared = self._shared_held.get(key)
        if shared and self.shared is not None:
            self.shared.release(shared.pop())
            if not shared:
                del self._shared_held[key]
        self._release_here(key)

    def _release_here(self, key: Hashable) -> None:
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
        return self._in_use < self.total and not (key is not None and self._held[key] >= self.per_key)

    def _take(self, key: Hashable) -> None:
        self._in_use += 1
        if key is not None:
            self._held[key] += 1


_PLAIN = re.compile(r"^[A-Za-z0-9_.-]{1,48}$")


def group_of(key: Hashable) -> str:
    """The shared slots' group of ``key``: its principal's name (``key-1a2b3c4d``, a digest of the key, never its
    text), or a digest of what the caller passed."""
    name = str(getattr(key, "name", key))
    return f"share-{name}" if _PLAIN.match(name) else "share-" + hashlib.sha256(name.encode()).hexdigest()[:24]
