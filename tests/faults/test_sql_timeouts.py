"""Fault matrix, PostgreSQL frozen (every process SIGSTOPped): no call waits past ``call_timeout_s``.

The kernel keeps a frozen server's sockets open, so without a client-side
deadline a call would wait forever (and an indexing run with it, its lease
lapsing unseen). ``frozen.pause()`` stops only the postmaster, which
leaves open connections served; ``Frozen`` stops its backends too. Each call
here runs on a thread joined with a generous bound: a call still blocked after
it fails the test as a hang.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from strata.config import Settings
from strata.errors import StoreError
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from strata.stores.lease import KbLease
from strata.stores.sql import DocumentStore
from strata.stores.sql_database import SqlDatabase
from tests.support.paths import EXAMPLES_KB
from tests.support.processes import wait_for
from tests.support.servers import PrivatePostgres
from tests.support.stores import with_sections

pytestmark = pytest.mark.cost(20)

SETTING = "STRATA_DATABASE__CALL_TIMEOUT_S"
HANG_S = 60.0  # far past every timeout here: a call still blocked then would block forever


class Frozen:
    """Stops and continues every process of the private cluster: the postmaster and all it started."""

    def __init__(self, server: PrivatePostgres) -> None:
        self._server = server
        self._stopped: list[int] = []

    def pause(self) -> None:
        postmaster = int((self._server.data / "postmaster.pid").read_text().split("\n", 1)[0])
        self._stop(postmaster)  # first: it starts no new process while its children are stopped
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                parent = int(stat.read_text().rpartition(")")[2].split()[1])  # after the name: state, parent pid
            except (OSError, ValueError, IndexError):
                continue
            if parent == postmaster:
                self._stop(int(stat.parent.name))

    def resume(self) -> None:
        while self._stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._stopped.pop(), signal.SIGCONT)

    def _stop(self, pid: int) -> None:
        os.kill(pid, signal.SIGSTOP)
        self._stopped.append(pid)


@pytest.fixture
def frozen(private_postgres: PrivatePostgres) -> Iterator[Frozen]:
    """The private cluster, to freeze whole; running again afterwards."""
    freezer = Frozen(private_postgres)
    yield freezer
    freezer.resume()


@dataclass(frozen=True)
class Outcome:
    value: Any
    error: BaseException | None
    seconds: float


def bounded(call: Callable[[], Any]) -> Outcome:
    """``call``'s outcome on a thread of its own; a call still blocked after ``HANG_S`` fails the test."""
    done: list[Outcome] = []

    def run() -> None:
        started = time.monotonic()
        try:
            value, error = call(), None
        except BaseException as exc:  # the test asserts on it
            value, error = None, exc
        done.append(Outcome(value, error, time.monotonic() - started))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    assert done, f"the call was still blocked after {HANG_S:g} s"
    return done[0]


def assert_timed_out(outcome: Outcome, timeout_s: float) -> None:
    assert isinstance(outcome.error, StoreError), outcome
    assert SETTING in str(outcome.error) and f"within {timeout_s:g} s" in str(outcome.error)
    assert timeout_s <= outcome.seconds < timeout_s + 10, outcome.seconds


def timed(settings: Settings, call_timeout_s: float) -> Settings:
    return with_sections(settings, database={"call_timeout_s": call_timeout_s, "connect_timeout_s": 1.0})


def test_calls_to_a_frozen_server_fail_naming_the_timeout_and_the_same_stores_work_after_resume(
    demo_kb: Settings, frozen: Frozen
) -> None:
    settings = timed(demo_kb, 2.0).database
    db, store = SqlDatabase(settings), DocumentStore(settings)
    invalidated: list[object] = []
    event.listen(db.engine, "invalidate", lambda *args: invalidated.append(args))
    db.now()  # a pooled connection each, pinged before their next call
    store.kbs.get_kb("demo")

    frozen.pause()
    assert_timed_out(bounded(db.now), 2.0)
    assert_timed_out(bounded(lambda: store.kbs.ensure_kb("timeouts", encoder="e", dim=8, chunking="c")), 2.0)
    frozen.resume()

    assert invalidated, "the cut connection was dropped from the pool"
    assert db.now() and store.kbs.ensure_kb("timeouts", encoder="e", dim=8, chunking="c").kb_id == "timeouts"
    db.dispose()
    store.dispose()


def test_a_statement_or_commit_in_flight_when_the_server_freezes_is_cut(demo_kb: Settings, frozen: Frozen) -> None:
    db = SqlDatabase(timed(demo_kb, 2.0).database)
    invalidated: list[object] = []
    event.listen(db.engine, "invalidate", lambda *args: invalidated.append(args))

    def statement_after_pause() -> None:
        with db.begin() as conn:
            conn.execute(text("SELECT 1"))
            frozen.pause()
            conn.execute(text("SELECT 2"))

    def commit_after_pause() -> None:
        with db.begin() as conn:
            conn.execute(text("SELECT 1"))
            frozen.pause()

    for cuts, call in enumerate((statement_after_pause, commit_after_pause), start=1):
        assert_timed_out(bounded(call), 2.0)
        frozen.resume()
        assert len(invalidated) >= cuts, "the cut connection was dropped from the pool"
        assert db.now()
    db.dispose()


def test_calls_shorter_than_the_timeout_are_not_cut_however_long_the_connection_lives(
    demo_kb: Settings, frozen: Frozen
) -> None:
    db = SqlDatabase(timed(demo_kb, 1.5).database)
    with db.connect() as conn:
        slept = [conn.execute(text("SELECT 1 FROM pg_sleep(0.5)")).scalar() for _ in range(4)]  # 2 s on one connection
        conn.commit()
        time.sleep(2.0)  # idle past the commit's deadline: only a call in progress is cut
        assert conn.execute(text("SELECT 1")).scalar() == 1
    assert slept == [1] * 4
    db.dispose()


def test_the_lease_renewal_logs_the_timeout_instead_of_hanging(
    demo_kb: Settings, frozen: Frozen, caplog: pytest.LogCaptureFixture
) -> None:
    store = DocumentStore(timed(demo_kb, 1.0).database)
    lease = KbLease(store, "renewed", ttl_s=1.5)
    caplog.set_level(logging.WARNING, logger="strata.stores.lease")
    lease.acquire()

    def renewal_failed() -> bool:
        return any("could not renew" in r.getMessage() and SETTING in r.getMessage() for r in caplog.records)

    frozen.pause()
    try:
        failed = wait_for(renewal_failed, within_s=HANG_S)
    finally:
        frozen.resume()
    assert failed, caplog.text
    assert bounded(lease.release).error is None
    store.dispose()


def test_an_indexing_run_whose_server_freezes_midway_exits_with_the_timeout_error(
    demo_kb: Settings, frozen: Frozen, memo_encoder: Any
) -> None:
    resources = Resources(with_sections(timed(demo_kb, 2.0), indexing={"lease_ttl_s": 3.0}), encoder=memo_encoder)

    paused: list[str] = []

    def pause_after_the_first_write(step: str) -> None:
        if step == "sql_pending" and not paused:
            paused.append(step)
            frozen.pause()

    indexer = Indexer(resources, after_write_step=pause_after_the_first_write)
    try:
        outcome = bounded(lambda: indexer.index_paths([EXAMPLES_KB], kb_id="paused"))
    finally:
        frozen.resume()
        resources.close()
    assert paused and isinstance(outcome.error, StoreError), outcome
    assert SETTING in str(outcome.error)
