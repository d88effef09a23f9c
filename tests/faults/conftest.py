"""The fault matrix's fixtures: a private PostgreSQL to stop and restart, and an indexed kb.

``PrivatePostgres`` is a PostgreSQL 15 cluster of the test session's own
(``initdb`` in a temporary folder, trust auth, a free port on 127.0.0.1),
the counterpart of ``PrivateRedis`` in ``tests/conftest.py``: tests stop,
pause and restart it without disturbing the shared server on 5432. The
``private_postgres`` fixture hands it out running and leaves it running.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.conftest import EXAMPLES_KB, free_port, migrated
from tests.strata_support import make_settings

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


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PrivatePostgres]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL binaries not found in {PG_BIN} (set STRATA_TEST_PG_BIN)")
    server = PrivatePostgres(Path(tempfile.mkdtemp(prefix="strata-faults-pg-")))
    server.init()
    server.start()
    yield server
    server.destroy()


@pytest.fixture
def private_postgres(postgres_cluster: PrivatePostgres) -> Iterator[PrivatePostgres]:
    """The private cluster, running; whatever the test stopped or paused is running again afterwards."""
    if not postgres_cluster.running():
        postgres_cluster.start()
    yield postgres_cluster
    postgres_cluster.resume()
    if not postgres_cluster.running():
        postgres_cluster.start()


@pytest.fixture(scope="module")
def demo_kb(tmp_path_factory: pytest.TempPathFactory, postgres_cluster: PrivatePostgres, memo_encoder: Any) -> Settings:
    """examples/kb indexed as kb 'demo' (Milvus Lite + a database of the module's own on the private
    PostgreSQL + the shared Redis under a prefix of its own); query cache off."""
    if not postgres_cluster.running():
        postgres_cluster.start()
    root = tmp_path_factory.mktemp("faults")
    settings = make_settings(root, postgres_cluster.create_database())
    resources = Resources(settings, encoder=memo_encoder)
    try:
        assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    finally:
        resources.close()
    return settings


def with_sections(settings: Settings, **sections: dict[str, Any]) -> Settings:
    """``settings`` with some fields of some sections replaced."""
    return settings.model_copy(
        update={name: getattr(settings, name).model_copy(update=values) for name, values in sections.items()}
    )
