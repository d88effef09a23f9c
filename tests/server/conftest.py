"""The ``milvus_server`` tests' own helpers: a fresh collection per test, and reads that settle.

The server itself is the session's ``milvus_server_uri`` (tests/conftest.py): ``STRATA_TEST_MILVUS_URI``,
a Milvus standalone container where Docker runs, or a ``milvus-lite server`` the tests start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import pytest

from strata.config import MilvusSettings
from tests.conftest import server_collection

T = TypeVar("T")


@contextmanager
def fresh_collection(uri: str, prefix: str) -> Iterator[MilvusSettings]:
    """Settings of a new collection on the server (isolation auto: the kb id is the partition key), dropped after."""
    with server_collection(uri, prefix) as target:
        yield MilvusSettings(uri=target.uri, collection=target.collection, token=target.token)


@pytest.fixture
def server_milvus(milvus_server_uri: str) -> Iterator[MilvusSettings]:
    """A fresh collection on the server for one test."""
    with fresh_collection(milvus_server_uri, "strata_test") as settings:
        yield settings


def settled(read: Callable[[], T], done: Callable[[T], bool], *, within_s: float = 30.0) -> T:
    """``read()`` until ``done`` holds or ``within_s`` passed; returns the last answer for the caller to assert.

    For reads at Bounded consistency (searches): a server may answer without rows flushed a moment
    ago (for up to its graceful time, 5 s by default). Counts are Strong and need no settling
    (``test_a_strong_count_right_after_a_flush_is_exact``).
    """
    deadline = time.monotonic() + within_s
    while True:
        answer = read()
        if done(answer) or time.monotonic() >= deadline:
            return answer
        time.sleep(0.5)
