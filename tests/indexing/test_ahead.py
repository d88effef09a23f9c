"""The writer's read-ahead (strata.indexing.ahead): order kept, errors raised where they happened, memory bounded,
the producer stopped when the consumer leaves."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from strata.indexing.ahead import ahead


def test_items_come_out_in_order_and_all_of_them() -> None:
    with ahead(iter(range(500)), depth=2) as items:
        assert list(items) == list(range(500))


def test_an_error_of_the_producer_is_raised_in_the_consumer_after_the_items_before_it() -> None:
    def failing() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("document 3 broke")

    seen: list[int] = []
    with pytest.raises(ValueError, match="document 3 broke"), ahead(failing()) as items:
        for item in items:
            seen.append(item)
    assert seen == [1, 2]


def test_the_producer_is_never_more_than_depth_items_ahead_plus_the_one_it_makes() -> None:
    taken = [0]
    ahead_by: list[int] = []

    def counted() -> Iterator[int]:
        for n in range(300):
            ahead_by.append(n - taken[0])  # items made before this one that the consumer has not counted yet
            yield n

    with ahead(counted(), depth=2) as items:
        for _ in items:
            taken[0] += 1
    assert taken[0] == 300
    # depth 2 in the queue, plus the one the consumer holds before it counts it
    assert max(ahead_by) <= 3


def test_a_consumer_that_leaves_ends_the_producer() -> None:
    made = [0]

    def endless() -> Iterator[int]:
        while True:
            made[0] += 1
            yield made[0]

    with ahead(endless(), depth=1, name="test-ahead-leaves") as items:
        assert next(items) == 1
    (producer,) = [t for t in threading.enumerate() if t.name == "test-ahead-leaves"] or [None]
    if producer is not None:
        producer.join(timeout=10)
        assert not producer.is_alive()
    assert made[0] <= 3  # the one taken, one in the queue, one it could not hand over


def test_a_producer_gone_without_its_last_item_is_an_error_not_a_hang() -> None:
    """The consumer never waits on a thread that is gone (it ends by handing over its end or an error)."""
    from strata.indexing import ahead as module

    worker = module._Ahead(iter([1]), 1, "test-ahead-gone")
    worker._left.set()  # the producer hands nothing over, as if it had died
    worker.start()
    worker._thread.join(timeout=10)
    with pytest.raises(RuntimeError, match="ended without its last item"):
        next(iter(worker))


def test_depth_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="depth"), ahead(iter(()), depth=0):
        pass
