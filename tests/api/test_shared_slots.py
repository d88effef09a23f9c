"""Slots shared by worker processes: a key's share counts every process's requests, and a process that dies
holding slots gives them back (the kernel drops its locks), however it dies."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from strata.api.shared_slots import FileSlots, LocalSlots, Slots
from strata.api.slots import KeySlots, group_of

pytestmark = pytest.mark.unit

HOLD_AND_WAIT = """
import sys
from pathlib import Path
from strata.api.shared_slots import FileSlots
slots = FileSlots(Path(sys.argv[1]))
held = [slots.take("share-key-x", 2) for _ in range(2)]
print("held" if all(held) else "refused", flush=True)
sys.stdin.read()
"""


@pytest.fixture(params=["file", "local"])
def slots(request: pytest.FixtureRequest, tmp_path: Path) -> Slots:
    return FileSlots(tmp_path) if request.param == "file" else LocalSlots()


def test_a_group_holds_its_size_and_a_released_slot_is_taken_again(slots: Slots) -> None:
    first, second = slots.take("g", 2), slots.take("g", 2)
    assert first is not None and second is not None
    assert slots.take("g", 2) is None
    assert slots.take("other", 1) is not None  # groups are apart
    slots.release(first)
    assert slots.take("g", 2) is not None


def test_two_processes_share_a_group_and_a_killed_one_gives_its_slots_back(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_AND_WAIT, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        slots = FileSlots(tmp_path)
        assert slots.take("share-key-x", 2) is None  # both held by the other process
        os.kill(holder.pid, signal.SIGKILL)  # no finally, no release: the kernel closes its descriptors
        holder.wait(30)
        taken = [slots.take("share-key-x", 2) for _ in range(2)]
        assert all(taken)
    finally:
        holder.kill()
        holder.wait(30)


def test_a_keys_share_holds_across_two_processes_slots(tmp_path: Path) -> None:
    async def scenario() -> None:
        worker_a, worker_b = KeySlots(8, 2, FileSlots(tmp_path)), KeySlots(8, 2, FileSlots(tmp_path))
        assert await worker_a.acquire("tenant", 0) and await worker_b.acquire("tenant", 0)
        assert not await worker_b.acquire("tenant", 0.05)  # its own process holds 1 of 2, the service 2
        assert worker_a.at_share("tenant") and worker_b.at_share("tenant")
        assert worker_b.in_use == 1  # the refused request gave its process's slot back
        assert await worker_b.acquire("another", 0)  # another key's share is its own
        waiting = asyncio.ensure_future(worker_b.acquire("tenant", 5))
        await asyncio.sleep(0)  # let it start waiting, then free a slot in the other process
        worker_a.release("tenant")
        assert await waiting
        assert worker_a.held_by("tenant") == 0 and worker_b.held_by("tenant") == 2

    asyncio.run(scenario())


def test_a_group_name_never_holds_the_key() -> None:
    assert group_of("key-1a2b3c4d") == "share-key-1a2b3c4d"
    secret = "tenant-a-write-key-0123456789/../x"
    assert secret not in group_of(secret) and "/" not in group_of(secret)
