"""A flush waits its own setting, not the general timeout, and a flush that runs out names that setting.

A private ``milvus-lite server``, SIGSTOPped after one leaf was written: the flush is cut at
``STRATA_MILVUS__FLUSH_TIMEOUT_S`` (set short here), and the error says so. The general timeout
(``STRATA_MILVUS__TIMEOUT_S``) is set far longer, so a flush still waiting on it would hang the test
for minutes instead of failing at once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from strata.config import MilvusSettings
from strata.errors import StoreError
from strata.stores.milvus_collection import LeafCollection
from strata.types import Chunk
from tests.support.milvus import MilvusServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.cost(20)]  # a Milvus server of its own

FLUSH_S, GENERAL_S = 2.0, 300.0


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MilvusServerProcess]:
    process = MilvusServerProcess(tmp_path / "milvus")
    process.start()
    yield process
    process.stop()


def test_a_flush_is_cut_at_its_own_setting_and_names_it(server: MilvusServerProcess) -> None:
    settings = MilvusSettings(uri=server.uri, timeout_s=GENERAL_S, flush_timeout_s=FLUSH_S, isolation="partition")
    collection = LeafCollection(settings, encoder_name="test", dim=4)
    leaf = Chunk("k-1", "k", "doc.md", 1, 3, None, "k-1", 0, "the ferry leaves at dawn", "Doc", 0, 24)
    collection.writes.upsert([leaf], np.ones((1, 4), dtype=np.float32), [leaf.text])
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(StoreError) as cut:
            collection.writes.flush()
    finally:
        server.process.send_signal(signal.SIGCONT)
    waited = time.monotonic() - started
    assert "STRATA_MILVUS__FLUSH_TIMEOUT_S" in str(cut.value), cut.value
    assert waited < GENERAL_S / 2, waited  # not the general timeout
    collection.writes.flush()  # the server continued: the flush goes through
    collection.close()
