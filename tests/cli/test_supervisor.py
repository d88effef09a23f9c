"""The supervisor's health check of a ``strata serve --workers N`` worker, on real processes.

uvicorn pings a worker and waits for its answer up to ``WORKER_HEALTHCHECK_S`` (30 s in ``strata serve``); a
worker killed after the ping was sent made the supervisor wait all of it before it started another and retired
the dead worker's gauges. ``WAIT_S`` bounds the wait here (well under that timeout), it does not time it.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

import pytest
from uvicorn import Config

from strata.cli.serve import WORKER_HEALTHCHECK_S
from strata.cli.supervisor import WorkerProcess
from tests.support.processes import wait_for

pytestmark = pytest.mark.integration  # worker processes of their own

WAIT_S = 10.0  # an upper bound for the check to end, a third of WORKER_HEALTHCHECK_S


def _answer_pings(conn: Connection) -> None:
    while True:
        conn.recv()
        conn.send(True)


@pytest.fixture
def worker() -> Iterator[WorkerProcess]:
    """A ``WorkerProcess`` whose process is one of the test's: it answers pings, or sleeps without answering."""
    process = WorkerProcess(Config("strata.api.app:app_from_environment", factory=True), [])
    yield process
    if process.process.pid is not None and process.process.is_alive():
        process.process.kill()
        process.process.join(WAIT_S)


def test_a_worker_that_answers_is_alive(worker: WorkerProcess) -> None:
    worker.process = multiprocessing.get_context("spawn").Process(target=_answer_pings, args=(worker.child_conn,))
    worker.process.start()
    assert worker.is_alive(timeout=WORKER_HEALTHCHECK_S)


def test_a_worker_killed_during_its_health_check_is_found_dead_without_waiting_out_the_timeout(
    worker: WorkerProcess,
) -> None:
    worker.process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(3600,))
    worker.process.start()
    with ThreadPoolExecutor(1) as pool:
        check = pool.submit(worker.is_alive, WORKER_HEALTHCHECK_S)
        assert wait_for(lambda: worker.child_conn.poll(0), within_s=WAIT_S)  # the ping is sent; nobody will answer
        assert worker.process.pid is not None
        os.kill(worker.process.pid, signal.SIGKILL)
        assert check.result(timeout=WAIT_S) is False
