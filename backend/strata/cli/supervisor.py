"""The server and the supervisor of ``strata serve``: uvicorn's, bounded in time at shutdown.

``StrataServer`` is the uvicorn server of one process (the only one, or each worker). When the signal to stop
arrives it tells the process's work at once (``strata.api.stopping``: an upload stops at its next batch
boundary instead of running on through the grace) and starts a clock: a process still running
``EXIT_BUDGET_S`` after the grace (a store call that never returns, a thread that never ends) logs one line
and exits 1, so the kubelet's SIGKILL never has to.

``WorkerSupervisor`` runs ``--workers N`` as uvicorn's does, with ``StrataServer`` in each worker; it also
retires the metrics of a worker gone (each pass of its loop, every 0.5 s, after the signals, it compares the
workers it runs with those of the pass before and hands each pid that left to ``retire_worker``: that
worker's live gauges leave the scrape, its counters stay in it), and kills a worker that has not exited
within its budget after the supervisor's SIGTERM.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
import time
from socket import socket
from types import FrameType

from uvicorn import Config, Server
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import Multiprocess
from uvicorn.supervisors.multiprocess import Process

from strata.api import stopping
from strata.api.metrics import retire_worker

logger = logging.getLogger("strata")

# After the grace: the lifespan's shutdown (indexing runs unwound, their leases released, the stores closed) and
# the exit. deploy/k8s/deployment.yaml's terminationGracePeriodSeconds covers preStop + grace + this
# (+ ``SUPERVISOR_SLACK_S``: tests/test_deploy.py checks the sum; tests/api/test_serve_shutdown.py measures a shutdown under an upload).
EXIT_BUDGET_S = 8.0
SUPERVISOR_SLACK_S = 2.0  # what ``--workers N`` adds: the supervisor's 0.5 s poll, its wait past the workers' clocks
EXIT_OVERRUN = 1  # the exit status of a process its budget ended
PING_SLICE_S = 0.25  # a health check looks this often whether the worker it waits on still runs


def exit_deadline_s(config: Config) -> float:
    """Seconds from the signal to stop until the process must have exited."""
    return (config.timeout_graceful_shutdown or 0) + EXIT_BUDGET_S


class StrataServer(Server):
    """uvicorn's server, which tells the process's work to stop as the signal arrives and bounds the exit."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self._exit_clock: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        stopping.notify()
        if self._exit_clock is None:
            self._exit_clock = threading.Timer(
                exit_deadline_s(self.config), _overran, args=(exit_deadline_s(self.config),)
            )
            self._exit_clock.daemon = True
            self._exit_clock.start()


def _overran(deadline_s: float) -> None:
    logger.error(
        "shutdown overran its budget: still running %g s after the signal to stop (STRATA_API__SHUTDOWN_GRACE_S "
        "+ %g s); exiting now",
        deadline_s,
        EXIT_BUDGET_S,
    )
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(EXIT_OVERRUN)


class WorkerProcess(Process):
    """uvicorn's worker process, serving with ``StrataServer``, whose health check ends when the worker does."""

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = StrataServer(config=self.config)
        return self._server

    def _healthcheck(self, timeout: float) -> bool | None:
        """uvicorn's (0.54) ping, answered by the worker's startup flag or None; it also looks, every
        ``PING_SLICE_S``, whether the worker still runs. uvicorn's waits the whole timeout (``WORKER_HEALTHCHECK_S``,
        30 s, in ``strata serve``) for a worker that died after the ping was sent: the supervisor noticed it, and
        started another, and retired its gauges, only then."""
        deadline = time.monotonic() + timeout
        try:
            self.parent_conn.send(b"ping")
            while True:
                remaining = deadline - time.monotonic()
                if self.parent_conn.poll(max(0.0, min(PING_SLICE_S, remaining))):
                    started: bool = self.parent_conn.recv()
                    return started
                if remaining <= 0 or not self.process.is_alive():
                    return None
        except (OSError, EOFError, pickle.UnpicklingError):
            return None


class WorkerSupervisor(Multiprocess):
    """``uvicorn.supervisors.Multiprocess`` with ``StrataServer`` workers that retires each worker's metrics
    once it has left and kills a worker still running past its exit deadline."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        super().__init__(config, sockets)
        self._known: set[int] = set()

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            process = WorkerProcess(self.config, self.sockets)
            process.start()
            self.processes.append(process)

    def keep_subprocess_alive(self) -> None:
        """uvicorn's (0.54) pass, replacing a dead or hung worker with a ``WorkerProcess``; then the metrics of
        the workers gone are retired. (Workers SIGHUP or SIGTTIN start are uvicorn's own: they serve without
        the early stop, and ``join_all``'s bound still holds them.)"""
        if not self.should_exit.is_set():
            for idx, process in enumerate(self.processes):
                if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                    continue
                process.kill()  # hung or dead
                process.join()
                if process.exitcode == STARTUP_FAILURE:  # it would fail the same way on every restart
                    logger.error("worker %s failed to start: stopping", process.pid)
                    self.should_exit.set()
                    break
                if self.should_exit.is_set():
                    break
                logger.info("worker %s died: starting another", process.pid)
                self.processes[idx] = WorkerProcess(self.config, self.sockets)
                self.processes[idx].start()
        live = {process.pid for process in self.processes if process.pid is not None}
        for pid in self._known - live:
            retire_worker(pid)
        self._known = live

    def join_all(self) -> None:
        deadline = time.monotonic() + exit_deadline_s(self.config) + 1.0  # a worker's own clock ends it first
        for process in self.processes:
            process.process.join(max(0.0, deadline - time.monotonic()))
            if process.process.is_alive():
                logger.error("worker %s still running past its shutdown budget: killing it", process.pid)
                os.kill(process.pid or 0, signal.SIGKILL)
                process.process.join(5)
