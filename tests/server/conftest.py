"""The ``milvus_server`` tests' own fixture: a fresh collection per test (``fresh_collection`` and
``settled``, the reads that settle, are in tests/support/milvus.py).

The server itself is the session's ``milvus_server_uri`` (tests/conftest.py): ``STRATA_TEST_MILVUS_URI``,
a Milvus standalone container where Docker runs, or a ``milvus-lite server`` the tests start.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strata.config import MilvusSettings
from tests.support.milvus import fresh_collection


@pytest.fixture
def server_milvus(milvus_server_uri: str) -> Iterator[MilvusSettings]:
    """A fresh collection on the server for one test."""
    with fresh_collection(milvus_server_uri, "strata_test") as settings:
        yield settings
