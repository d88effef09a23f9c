"""The fault matrix's fixtures: a private PostgreSQL to stop and restart, and an indexed kb.

``postgres_cluster`` is a ``PrivatePostgres`` (tests/support/servers.py) of the test session's own;
the ``private_postgres`` fixture hands it out running and leaves it running.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.support.paths import EXAMPLES_KB
from tests.support.servers import PG_BIN, PrivatePostgres
from tests.support.stores import make_settings


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
