"""The indexing lease on SQLite and PostgreSQL: a holder that died on this host is taken over at once,
a live one (or one whose pid this host cannot judge) is not."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from strata.errors import LeaseHeldError, LeaseLostError
from strata.stores.lease import KbLease, process_space
from strata.stores.sql import DocumentStore
from strata.stores.sql_schema import kb_leases

TTL_S = 600.0  # far longer than any test: only a takeover, never an expiry, can free the lease


@pytest.fixture
def store(database_settings) -> Iterator[DocumentStore]:
    store = DocumentStore(database_settings)
    yield store
    store.dispose()


def record_holder(store: DocumentStore, kb_id: str, owner: str) -> None:
    """A lease row as a holder leaves it when it is killed: unexpired, never released."""
    now = datetime.now(UTC).replace(tzinfo=None)
    row = {"kb_id": kb_id, "owner": owner, "acquired_at": now, "expires_at": now + timedelta(seconds=TTL_S)}
    with store.engine.begin() as conn:
        conn.execute(insert(kb_leases).values(**row))


def holder_of(store: DocumentStore, kb_id: str) -> str | None:
    with store.engine.connect() as conn:
        return conn.execute(select(kb_leases.c.owner).where(kb_leases.c.kb_id == kb_id)).scalar()


@pytest.fixture
def live_process() -> Iterator[subprocess.Popen[bytes]]:
    """Another process of this host that keeps running until the test ends."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield process
    process.communicate(timeout=30)


def test_a_lease_whose_holder_exited_is_taken_at_once(store: DocumentStore) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    assert process.wait(timeout=60) == 0  # exited and reaped: its pid names no process now
    dead = f"{process_space()}:pid {process.pid}:gone"
    record_holder(store, "kb", dead)
    with KbLease(store, "kb", ttl_s=TTL_S) as lease:
        assert holder_of(store, "kb") == lease.owner != dead
    assert holder_of(store, "kb") is None  # released as usual


@pytest.mark.skipif(not hasattr(os, "waitid"), reason="needs waitid to leave a zombie")
def test_a_killed_holder_not_yet_reaped_is_taken_at_once(store: DocumentStore) -> None:
    """A worker killed under a busy supervisor is a zombie until its parent waits for it: it holds nothing."""
    process = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    process.kill()
    try:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)  # it has died; not reaped, it stays a zombie
        record_holder(store, "kb", f"{process_space()}:pid {process.pid}:zombie")
        with KbLease(store, "kb", ttl_s=TTL_S) as lease:
            assert holder_of(store, "kb") == lease.owner
    finally:
        process.wait(timeout=60)


def test_a_lease_held_by_a_live_process_is_not_taken(
    store: DocumentStore, live_process: subprocess.Popen[bytes]
) -> None:
    alive = f"{process_space()}:pid {live_process.pid}:busy"
    record_holder(store, "kb", alive)
    with pytest.raises(LeaseHeldError, match=f"pid {live_process.pid}") as refused:
        KbLease(store, "kb", ttl_s=TTL_S).acquire()
    assert refused.value.kb_id == "kb" and 1 <= refused.value.retry_after_s <= TTL_S + 1
    assert holder_of(store, "kb") == alive


def test_a_pid_of_another_host_or_pid_namespace_is_not_judged_here(store: DocumentStore) -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    assert process.wait(timeout=60) == 0  # no such pid here; elsewhere it may well run
    for kb, space in [("kb-host", "indexer-host-7"), ("kb-ns", process_space() + "0")]:
        record_holder(store, kb, f"{space}:pid {process.pid}:elsewhere")
        with pytest.raises(LeaseHeldError, match=re.escape(space)):
            KbLease(store, kb, ttl_s=TTL_S).acquire()
        assert holder_of(store, kb) == f"{space}:pid {process.pid}:elsewhere"


def test_a_holder_whose_lease_was_taken_writes_nothing_more(store: DocumentStore) -> None:
    """Fencing: a holder paused past its lease (nobody renewed it) loses it to another writer; every transaction
    its thread begins afterwards fails with ``LeaseLostError`` before it writes, and its release frees nothing."""
    paused = KbLease(store, "kb", ttl_s=TTL_S)
    paused.acquire()  # this thread writes under it
    paused._stop.set()  # paused: its renewals stop
    paused._renewer.join()
    with store.engine.begin() as conn:  # its lease ran out, by the database's clock
        conn.execute(kb_leases.update().values(expires_at=store.now() - timedelta(seconds=1)))
    taker = KbLease(store, "kb", ttl_s=TTL_S)
    other = threading.Thread(target=taker.acquire)  # another writer, in a thread (a process) of its own
    other.start()
    other.join()
    assert holder_of(store, "kb") == taker.owner

    with pytest.raises(LeaseLostError, match="lost the indexing lease of knowledge base 'kb'") as lost:
        store.kbs.ensure_kb("kb", encoder="e", dim=3, chunking="c")
    assert taker.owner in str(lost.value)
    with pytest.raises(LeaseLostError):
        store.check_fences()  # what an indexer asks before a Milvus write
    assert store.kbs.get_kb("kb") is None, "nothing was written"
    paused.release()
    assert holder_of(store, "kb") == taker.owner, "the lost holder's release frees nothing of the taker's"
    store.kbs.ensure_kb("kb", encoder="e", dim=3, chunking="c")  # unfenced again once released
    assert store.kbs.get_kb("kb") is not None
