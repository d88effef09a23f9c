"""The bounds behind the hang matrix, without a server: which bound a store call gets, that the watchdog cuts a
short call while it sleeps towards a long one, and that readiness never waits on a check that hangs.

``test_hang_matrix`` shows the same on real stopped servers; these pin the mechanisms it depends on.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from strata.api.metrics import Metrics
from strata.api.readiness import READY_SETTING, Readiness
from strata.config import Settings
from strata.stores.call_watchdog import CallWatchdog
from strata.stores.store_timeouts import REQUEST_DEADLINE, Bound, bound, milvus_bound

pytestmark = pytest.mark.unit

WITHIN_S = 10.0  # a generous bound proving "does not hang", never a timing assertion


def test_a_call_gets_the_tighter_of_its_setting_and_what_is_left_of_the_request() -> None:
    assert bound(60.0, "STRATA_DATABASE__CALL_TIMEOUT_S") == Bound(60.0, "STRATA_DATABASE__CALL_TIMEOUT_S")
    assert bound(60.0, "X", Bound(1.25, REQUEST_DEADLINE)) == Bound(1.25, REQUEST_DEADLINE)
    assert bound(0.5, "X", Bound(1.25, REQUEST_DEADLINE)) == Bound(0.5, "X")
    assert bound(5.0, "X", Bound(-0.1, READY_SETTING)) == Bound(0.0, READY_SETTING)  # past it: no wait at all
    milvus = Settings(_env_file=None).milvus
    assert milvus_bound(milvus.count_timeout_s, milvus).setting == "STRATA_MILVUS__COUNT_TIMEOUT_S"
    assert milvus_bound(milvus.flush_timeout_s, milvus).setting == "STRATA_MILVUS__FLUSH_TIMEOUT_S"
    assert milvus_bound(0.731, milvus) == Bound(0.731, REQUEST_DEADLINE)  # cut below every setting: the deadline


def test_a_short_call_armed_while_the_watchdog_sleeps_towards_a_long_one_is_cut_at_its_own_deadline() -> None:
    cut = threading.Event()
    watchdog: CallWatchdog[str, Bound] = CallWatchdog(3600.0, lambda conn: conn == "short" and not cut.set())
    watchdog.arm("long")  # the thread now sleeps towards this hour-long deadline
    seen: list[Bound | None] = []

    def short_call() -> None:
        watchdog.arm("short", 0.05, Bound(0.05, REQUEST_DEADLINE))
        cut.wait(WITHIN_S)
        seen.append(watchdog.why_cut())

    started = time.monotonic()
    caller = threading.Thread(target=short_call)
    caller.start()
    caller.join(WITHIN_S)
    assert cut.is_set() and time.monotonic() - started < WITHIN_S
    assert seen == [Bound(0.05, REQUEST_DEADLINE)]  # the error of the cut call names the bound that cut it
    watchdog.disarm("long")


class _Hanging:
    """A store whose calls block until released, counting them."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def list_kbs(self) -> list[str]:
        self.calls += 1
        self.release.wait(WITHIN_S)
        return []


def _service(store: _Hanging) -> Any:
    """What readiness reads of a service: settings, metrics and the resources its checks call."""
    settings = Settings(_env_file=None, redis={"url": None}, api={"ready_timeout_s": 0.2})
    encoder = SimpleNamespace(name="fake", dim=2, encode_queries=lambda texts: np.zeros((len(texts), 2)))
    resources = SimpleNamespace(
        documents=SimpleNamespace(kbs=store),
        leaf_index=SimpleNamespace(ping=lambda: {"collection": "c"}),
        encoder=encoder,
    )
    return SimpleNamespace(settings=settings, metrics=Metrics(), resources=resources, reranker=None)


def test_a_hung_check_is_down_within_the_bound_is_asked_once_and_probes_answer_from_the_last_check() -> None:
    store = _Hanging()
    service = _service(store)
    readiness = Readiness(service, cache_s=0.0)

    async def probes() -> list[tuple[str, float]]:
        seen = []
        for _ in range(3):
            started = time.monotonic()
            components, _ = await readiness.components()
            seen.append((components["sql"]["status"], time.monotonic() - started))
            await readiness.settled()
        return seen

    try:
        seen = asyncio.run(probes())
    finally:
        store.release.set()
    assert [status for status, _ in seen] == ["down", "down", "down"]
    assert all(took < WITHIN_S for _, took in seen)
    assert store.calls == 1  # still hung: never asked again, no thread per probe
    assert 'strata_component_down{component="sql"} 1.0' in service.metrics.render().decode()
    assert 'strata_component_down{component="milvus"} 0.0' in service.metrics.render().decode()
