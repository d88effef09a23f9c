"""Work ahead of the writer: an iterator's items produced on a thread of their own, at most ``depth`` waiting.

The indexer's writer waits on its stores (SQL, Milvus, the cache: network or another process) and on the
encoder (native code that lets go of the interpreter lock). Meanwhile the next group of documents can be
read, chunked and its terms counted, which is Python work that needs the lock only while the writer does
not. ``ahead`` runs the producing iterator on a daemon thread and hands its items over a queue of
``depth`` places, so the producer is at most ``depth`` items (plus the one it is making) in front: memory
stays bounded whatever the number of documents.

- An exception of the producer is raised in the consumer, at the item where it happened.
- When the consumer stops early (an exception, a stopped run, a lost lease, the generator closed), the
  producer is told to stop: it ends at its next item boundary; what it was making is dropped. Its current
  item is not interrupted (a parse in progress ends by its own timeout or the run's stop event).
- Items come out in the producer's order; nothing is produced twice or lost.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")

_HANDOVER_POLL_S = 0.05  # how often a producer blocked on a full queue looks whether the consumer left


class _End:
    """The producer's last item: it ran out (``error`` None) or raised ``error``."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _Ahead(Generic[T]):
    def __init__(self, items: Iterable[T], depth: int, name: str) -> None:
        if depth < 1:  # a bug of the caller: strata passes a constant
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._items = items
        self._queue: queue.Queue[T | _End] = queue.Queue(maxsize=depth)
        self._left = threading.Event()  # the consumer stopped: the producer ends at its next boundary
        self._thread = threading.Thread(target=self._produce, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _produce(self) -> None:
        end = _End(None)
        try:
            for item in self._items:
                if not self._hand_over(item):
                    return
        except BaseException as exc:  # handed to the consumer, raised there
            end = _End(exc)
        self._hand_over(end)

    def _hand_over(self, item: T | _End) -> bool:
        while not self._left.is_set():
            try:
                self._queue.put(item, timeout=_HANDOVER_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Iterator[T]:
        while True:
            item = self._next()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item

    def _next(self) -> T | _End:
        while True:
            try:
                return self._queue.get(timeout=_HANDOVER_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():  # it always ends by handing over an _End
                    raise RuntimeError(f"the thread {self._thread.name} ended without its last item") from None

    def leave(self) -> None:
        """The consumer is done: the producer stops at its next boundary; what waits in the queue is dropped."""
        self._left.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break


@contextmanager
def ahead(items: Iterable[T], *, depth: int = 1, name: str = "strata-ahead") -> Iterator[Iterator[T]]:
    """``items`` produced on a thread, at most ``depth`` in front of the consumer (see the module's docstring).

    ``with ahead(groups_of_documents) as groups: for group in groups: write(group)``
    """
    worker = _Ahead(items, depth, name)
    worker.start()
    try:
        yield iter(worker)
    finally:
        worker.leave()
