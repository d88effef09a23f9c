"""The supervisor of ``strata serve --workers N``: uvicorn's, which also retires the metrics of a worker gone.

uvicorn replaces a worker that died or hung, and SIGHUP / SIGTTOU retire
workers too; each pass of its loop (every 0.5 s, after the signals) this one
compares the workers it runs with those of the pass before and hands each pid
that left to ``retire_worker``: that worker's live gauges leave the scrape, its
counters stay in it.
"""

from __future__ import annotations

from socket import socket

from uvicorn import Config
from uvicorn.supervisors import Multiprocess

from strata.api.metrics import retire_worker


class WorkerSupervisor(Multiprocess):
    """``uvicorn.supervisors.Multiprocess`` that retires each worker's metrics once it has left."""

    def __init__(self, config: Config, sockets: list[socket]) -> None:
        super().__init__(config, sockets)
        self._known: set[int] = set()

    def keep_subprocess_alive(self) -> None:
        super().keep_subprocess_alive()
        live = {process.pid for process in self.processes if process.pid is not None}
        for pid in self._known - live:
            retire_worker(pid)
        self._known = live
