"""The client's whole test module (``tests/api/test_client.py``: every test, for ``StrataClient`` and
``AsyncStrataClient``) against ``strata serve`` in a process of its own.

The module's tests and fixtures are imported as they are; only the stores and the server differ: the leaves on
the Milvus server (``milvus_server_uri``, a collection of their own), a PostgreSQL database of their own and the
shared Redis, indexed here (kbs ``demo`` and ``garden``) and served by ``strata serve`` with the test keys, so
that the in-process library the tests compare with reads the same stores.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.api.test_client import *  # noqa: F403 - the same tests, and their fixtures (connect, answering)
from tests.support.api import KEYS
from tests.support.documents import GARDEN_DOC
from tests.support.milvus import server_collection
from tests.support.paths import EXAMPLES_KB
from tests.support.processes import start_serve, stop_process, strata_env, wait_for
from tests.support.stores import fresh_pg_database, make_settings

pytestmark = [pytest.mark.slow, pytest.mark.cost(90)]  # strata serve in a process of its own, a Milvus server


@pytest.fixture(scope="module")
def stores(
    tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str, memo_encoder: Any
) -> Iterator[tuple[Settings, Resources]]:
    """What ``tests/api/conftest.py``'s ``stores`` holds (demo and garden, the synonyms, the query cache), on stores
    a second process can share."""
    root = tmp_path_factory.mktemp("client-on-serve")
    (root / "garden-src").mkdir()
    (root / "garden-src" / "handbook.md").write_text(GARDEN_DOC, encoding="utf-8")
    synonyms = root / "synonyms.yaml"
    synonyms.write_text("浇水: [watering, irrigation]\nTokenManagement: [Token, JWT]\n", encoding="utf-8")
    with fresh_pg_database() as pg_url, server_collection(milvus_server_uri) as target:
        settings = make_settings(root, pg_url, query_cache=True, retrieval={"synonyms": str(synonyms)})
        settings = settings.model_copy(update={"milvus": target.settings(root)})
        resources = Resources(settings, encoder=memo_encoder)
        indexer = Indexer(resources)
        assert indexer.index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
        assert indexer.index_paths([root / "garden-src"], kb_id="garden").failed == 0
        yield settings, resources
        resources.close()


@pytest.fixture(scope="module")
def served_url(stores: tuple[Settings, Resources], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``strata serve`` on the module's stores, with the test keys."""
    settings = stores[0]
    env = strata_env(
        tmp_path_factory.mktemp("serve-data"),
        STRATA_DATABASE__URL=str(settings.database.url),
        STRATA_REDIS__URL=str(settings.redis.url),
        STRATA_REDIS__KEY_PREFIX=settings.redis.key_prefix,
        STRATA_RETRIEVAL__SYNONYMS=str(settings.retrieval.synonyms),
        STRATA_MILVUS__URI=str(settings.milvus.uri),
        STRATA_MILVUS__COLLECTION=settings.milvus.collection,
        STRATA_MILVUS__TOKEN=settings.milvus.token.get_secret_value(),
        STRATA_API__KEYS=json.dumps(KEYS),
    )
    log = (Path(env["STRATA_DATA_DIR"]) / "serve.log").open("w")
    process, url = start_serve(env, stdout=log, stderr=subprocess.STDOUT)

    def ready() -> bool:
        assert process.poll() is None, f"strata serve exited: {Path(log.name).read_text()[-2000:]}"
        try:
            return httpx.get(f"{url}/ready", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        assert wait_for(ready, within_s=240), f"strata serve was not ready: {Path(log.name).read_text()[-2000:]}"
        yield url
    finally:
        stop_process(process, grace_s=30)
        log.close()
