"""Fair slots: one key holds at most its share, and a freed slot never goes to a key over it.

Pure asyncio, no server: every wait is for a condition (``until``), never a fixed time, and every
acquire that must not get a slot uses ``wait_s=0``, so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from strata.api.auth import OPEN, Principal
from strata.api.metrics import Metrics
from strata.api.middleware import ConcurrencyLimit
from strata.api.slots import KeySlots
from strata.config import ApiSettings

A = Principal(kbs=frozenset({"alpha"}), write=False, name="key-aaaaaaaa")
B = Principal(kbs=frozenset({"beta"}), write=False, name="key-bbbbbbbb")
LONG_S = 60.0  # a wait that must end by a hand-over, never by running out


async def until(condition: Callable[[], bool], rounds: int = 1000) -> None:
    """Lets the loop run until ``condition`` holds (bounded by rounds of the loop, not by time)."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_key_holds_at_most_its_share_and_another_key_still_gets_a_slot() -> None:
    async def scenario() -> None:
        slots = KeySlots(total=4, per_key=2)
        assert [await slots.acquire(A, 0) for _ in range(3)] == [True, True, False]
        assert slots.at_share(A) and slots.held_by(A) == 2
        assert await slots.acquire(B, 0) and slots.in_use == 3

    run(scenario())


def test_a_freed_slot_goes_to_the_oldest_waiter_under_its_share() -> None:
    async def scenario() -> None:
        slots = KeySlots(total=3, per_key=2)
        for key in (A, A, B):
            assert await slots.acquire(key, 0)
        a_waits = asyncio.create_task(slots.acquire(A, LONG_S))  # first in line, but A is at its share
        await until(lambda: slots.waiting == 1)
        b_waits = asyncio.create_task(slots.acquire(B, LONG_S))
        await until(lambda: slots.waiting == 2)
        slots.release(B)
        assert await b_waits and not a_waits.done() and slots.held_by(A) == 2
        slots.release(A)
        assert await a_waits and slots.in_use == 3 and slots.waiting == 0

    run(scenario())


def test_a_request_arriving_at_a_free_slot_does_not_pass_a_waiter_that_fits() -> None:
    async def scenario() -> None:
        slots = KeySlots(total=1, per_key=1)
        assert await slots.acquire(A, 0)
        b_waits = asyncio.create_task(slots.acquire(B, LONG_S))
        await until(lambda: slots.waiting == 1)
        slots.release(A)  # handed to B at once: a newcomer finds no free slot
        assert not await slots.acquire(A, 0)
        assert await b_waits and slots.held_by(B) == 1

    run(scenario())


def test_a_cancelled_or_timed_out_waiter_leaves_no_slot_taken() -> None:
    async def scenario() -> None:
        slots = KeySlots(total=1, per_key=1)
        assert await slots.acquire(A, 0)
        cancelled = asyncio.create_task(slots.acquire(B, LONG_S))
        await until(lambda: slots.waiting == 1)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        assert not await slots.acquire(B, 0)
        slots.release(A)
        assert slots.in_use == 0 and slots.waiting == 0
        assert await slots.acquire(B, 0) and await slots.acquire(A, 0) is False

    run(scenario())


def test_requests_without_a_key_count_against_the_total_only() -> None:
    async def scenario() -> None:
        slots = KeySlots(total=3, per_key=1)
        assert all([await slots.acquire(None, 0) for _ in range(3)])
        assert not await slots.acquire(None, 0) and not slots.at_share(None)

    run(scenario())


SHARES = [(8, None, 4), (1, None, 1), (3, None, 1), (8, 3, 3), (4, 9, 4)]  # slots, the setting, a key's share


@pytest.mark.parametrize(("total", "per_key", "share"), SHARES)
def test_a_keys_share_defaults_to_half_the_slots_at_most_all(total: int, per_key: int | None, share: int) -> None:
    api = ApiSettings(max_concurrency=total, max_concurrency_per_key=per_key)
    assert api.key_concurrency == share


# --- the middleware: a key over its share is a 503 naming the share; another key is served -------------


class HoldingApp:
    """An ASGI app that answers 200 once the test releases it; ``entered`` counts requests inside."""

    def __init__(self) -> None:
        self.entered = 0
        self.release = asyncio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.entered += 1
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def call(app: Any, principal: Principal) -> tuple[int, dict[str, Any]]:
    scope = {"type": "http", "method": "POST", "path": "/retrieve", "headers": [], "state": {"principal": principal}}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(body or b"{}")


def test_the_middleware_refuses_a_key_over_its_share_and_serves_another_key() -> None:
    async def scenario() -> None:
        inner, metrics = HoldingApp(), Metrics()
        limit = ConcurrencyLimit(inner, limit=4, per_key=2, wait_s=0.0, metrics=metrics)
        holding = [asyncio.create_task(call(limit, A)) for _ in range(2)]
        await until(lambda: inner.entered == 2)
        status, problem = await call(limit, A)
        assert status == 503 and "share" in problem["detail"]
        b_call = asyncio.create_task(call(limit, B))
        await until(lambda: inner.entered == 3)
        inner.release.set()
        assert [await task for task in (*holding, b_call)] == [(200, {})] * 3
        rendered = metrics.render().decode()
        assert 'strata_http_requests_rejected_total{reason="key_concurrency"} 1.0' in rendered

    run(scenario())


def test_without_keys_only_the_total_limits_requests() -> None:
    async def scenario() -> None:
        inner = HoldingApp()
        limit = ConcurrencyLimit(inner, limit=3, per_key=1, wait_s=0.0, metrics=Metrics())
        holding = [asyncio.create_task(call(limit, OPEN)) for _ in range(3)]
        await until(lambda: inner.entered == 3)
        status, problem = await call(limit, OPEN)
        assert status == 503 and "busy" in problem["detail"]
        inner.release.set()
        assert all(status == 200 for status, _ in [await task for task in holding])

    run(scenario())
