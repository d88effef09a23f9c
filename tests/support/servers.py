"""Redis and PostgreSQL servers of the tests' own, to stop, pause and restart.

The tests that take a store down use these, never the shared servers on 6379 and 5432.
``PrivatePostgres`` is a PostgreSQL 15 cluster (``initdb`` in a temporary folder, trust auth, a free
port on 127.0.0.1), the counterpart of ``PrivateRedis``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import redis

from tests.support.processes import free_port
from tests.support.stores import migrated


class PrivateRedis:
    """A redis-server process of the test's own, to stop, pause and restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.2).ping():
                    return
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            self.process.wait(10)

    def kill(self) -> None:
        """SIGKILL: nothing is saved (the server keeps nothing on disk); ``start`` brings it back on its port."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)


PG_BIN = Path(os.environ.get("STRATA_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PrivatePostgres:
    """A PostgreSQL cluster of the tests' own, to stop, pause and restart.

    ``initdb`` refuses to run as root, so as root the cluster belongs to the
    ``postgres`` user and every ``pg_ctl`` runs as that user.
    """

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.root = root
        self.data = root / "data"
        self._user = "postgres" if os.geteuid() == 0 else None
        self.admin_url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"  # its SQLAlchemy URL

    def init(self) -> None:
        if self._user:
            entry = pwd.getpwnam(self._user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60"
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "-t", "60", "start"
        )

    def stop(self) -> None:
        self.resume()
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def restart(self) -> None:
        """A fast restart: every open connection is closed by the server."""
        # -l: the new postmaster must not inherit our pipes (pg_ctl would then never seem to finish)
        self._run(
            "pg_ctl", "-D", str(self.data), "-m", "fast", "-l", str(self.root / "log"), "-w", "-t", "60", "restart"
        )

    def running(self) -> bool:
        status = subprocess.run(self._command("pg_ctl", "-D", str(self.data), "status"), capture_output=True)
        return status.returncode == 0

    def pause(self) -> None:
        """SIGSTOP to the postmaster: new connections are accepted by the kernel and never answered."""
        os.kill(self._postmaster_pid(), signal.SIGSTOP)

    def resume(self) -> None:
        pid_file = self.data / "postmaster.pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._postmaster_pid(), signal.SIGCONT)

    def create_database(self) -> str:
        """A new database at strata's schema (``strata db upgrade``); its SQLAlchemy URL."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return migrated(f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}")

    def destroy(self) -> None:
        if self.running():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def _postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])

    def _command(self, tool: str, *args: str) -> list[str]:
        command = [str(PG_BIN / tool), *args]
        return ["runuser", "-u", self._user, "--", *command] if self._user else command

    def _run(self, tool: str, *args: str) -> None:
        done = subprocess.run(self._command(tool, *args), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed ({done.returncode}): {done.stderr[-2000:]}")
