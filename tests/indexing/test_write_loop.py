"""The pieces of the one write loop (issue 35): the write steps, the checkpoint, the chunk source's batches
for held and re-chunked documents, groups, a plan that writes nothing, and one loop writing a run that
mixes small and large documents, in place and with ``--recreate``."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.config import ChunkingSettings
from strata.errors import InvalidArgumentError
from strata.indexing.chunking import chunk_document
from strata.indexing.loaders import load_document
from strata.indexing.pipeline import Indexer
from strata.indexing.plan import DeleteLimit, DocumentPlan, Scan
from strata.indexing.report import IndexReport
from strata.indexing.run import ENCODER_BATCH, WRITE_STEPS, Checkpoint, WriteStep
from strata.indexing.run_plan import RunOptions, plan_run
from strata.indexing.scan import scan_paths
from strata.indexing.source import ChunkSource, PreparedDocument, groups
from tests.indexing.test_large_documents import (
    HashEncoder,
    RecordingLeafIndex,
    RecordingProgress,
    _settings,
    many_leaves,
)
from tests.support.documents import write_files
from tests.support.snapshots import store_state
from tests.support.stores import opened, with_parts


def test_the_write_steps_keep_the_names_the_crash_tests_kill_at() -> None:
    assert WRITE_STEPS == ("sql_pending", "milvus_upsert", "milvus_flush", "activate", "retire_milvus", "retire_sql")
    assert ENCODER_BATCH == "encoder_batch"
    assert [step.value for step in WriteStep] == [*WRITE_STEPS, ENCODER_BATCH]


def test_a_checkpoint_passes_the_step_name_then_checks_the_fence_but_not_after_an_encoder_batch() -> None:
    calls: list[str] = []
    checkpoint = Checkpoint(fences=lambda: calls.append("fence"), after_write_step=calls.append)
    checkpoint(WriteStep.SQL_PENDING)
    checkpoint(WriteStep.ENCODER_BATCH)
    checkpoint(WriteStep.ACTIVATE)
    assert calls == ["sql_pending", "fence", "encoder_batch", "activate", "fence"]
    assert all(type(call) is str for call in calls)  # the seam gets plain names, as tests/kill_at_launcher.py compares


def _prepared(doc_id: str, leaves: int) -> PreparedDocument:
    item = DocumentPlan(doc=None, version=1, previous=None)  # type: ignore[arg-type]  # groups read counts only
    return PreparedDocument(item=item, held=None, leaf_count=leaves, chunk_count=leaves, term_counts=None)


def test_groups_close_once_they_reach_the_leaf_budget_and_a_larger_document_is_its_own() -> None:
    docs = [_prepared(name, leaves) for name, leaves in [("a", 3), ("b", 4), ("c", 25), ("d", 2), ("e", 9), ("f", 1)]]
    sizes = [[doc.leaf_count for doc in group] for group in groups(docs, 10)]
    assert sizes == [[3, 4], [25], [2, 9], [1]]


def _source(tmp_path: Path, group_leaves: int) -> tuple[ChunkSource, ChunkingSettings, Path]:
    settings = _settings(tmp_path / "data").chunking
    docs = write_files(tmp_path / "docs", {"small.md": many_leaves(4, "export"), "big.md": many_leaves(23)})
    load = lambda path, root: load_document(path, root=root)  # noqa: E731
    return ChunkSource("kb", settings, group_leaves=group_leaves, load=load, count_terms=None), settings, docs


def test_terms_counted_for_many_documents_at_once_are_each_documents_own_and_a_failed_count_fails_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documents' terms are counted many documents a call (``COUNT_BATCH`` leaves), a large document's as it is
    chunked; each document gets the counts of its own leaves; a count that fails on one document fails it
    alone."""
    import strata.indexing.source as source_module
    from strata.stores.analyzer import analyzer_tokenizer
    from strata.stores.term_stats import count_terms

    monkeypatch.setattr(source_module, "COUNT_BATCH", 10)
    tokenize = analyzer_tokenizer({"tokenizer": "standard"})
    calls: list[int] = []

    def counter(
        documents: list[list[str]],
    ) -> list[dict[str, int]]:  # the WorkerTermCounter contract, counted here; a document holding "poison" fails
        calls.append(len(documents))
        if any("poison" in text for texts in documents for text in texts):
            raise RuntimeError("the tokenizer broke")
        return [count_terms(texts, tokenize) for texts in documents]

    settings = _settings(tmp_path / "data").chunking
    files = {f"s{n}.md": many_leaves(3, f"topic{n}") for n in range(6)}
    files["bad.md"] = many_leaves(3, "poison")
    files["big.md"] = many_leaves(23, "large")
    docs = write_files(tmp_path / "docs", files)
    loaded = [load_document(docs / name, root=docs) for name in sorted(files)]
    source = ChunkSource("kb", settings, group_leaves=50, load=load_document, count_terms=counter)
    report = IndexReport(kb="kb")
    prepared = list(source.prepared(Scan(docs=tuple(loaded)), [DocumentPlan(d, 1, None) for d in loaded], report))

    assert [doc.item.doc.source for doc in prepared] == [name for name in sorted(files) if name != "bad.md"]
    assert [failure["source"] for failure in report.failures] == ["bad.md"]
    for doc in prepared:
        leaves = [c for c in chunk_document(doc.item.doc, kb_id="kb", version=1, settings=settings) if c.is_leaf]
        texts = [source_module.search_text(c, settings.contextualize) for c in leaves]
        assert doc.term_counts == count_terms(texts, tokenize), doc.item.doc.source
    assert max(calls) > 1  # small documents shared a call


def test_held_and_re_chunked_documents_come_out_as_the_same_bounded_batches_parents_first(tmp_path: Path) -> None:
    source, settings, docs = _source(tmp_path, group_leaves=5)
    loaded = [load_document(docs / name, root=docs) for name in ("small.md", "big.md")]
    report = IndexReport(kb="kb")
    prepared = list(source.prepared(Scan(docs=tuple(loaded)), [DocumentPlan(d, 1, None) for d in loaded], report))
    small, big = prepared
    assert small.held is not None and big.held is None  # 4 leaves are held; 23 are chunked again as written
    batches = list(source.batches(prepared))
    whole = [c for d in loaded for c in chunk_document(d, kb_id="kb", version=1, settings=settings)]
    written = [c for batch in batches for c in batch]
    assert sorted(c.chunk_id for c in written) == sorted(c.chunk_id for c in whole)  # each chunk once
    assert all(sum(c.is_leaf for c in batch) <= 5 for batch in batches)
    assert len(batches) >= 23 // 5
    seen: set[str] = set()
    for batch in batches:  # a chunk's parent is written in its batch or an earlier one
        seen |= {c.chunk_id for c in batch}
        assert all(c.parent_id is None or c.parent_id in seen for c in batch)
    assert (small.leaf_count, big.leaf_count, report.failed) == (4, 23, 0)


def test_planning_writes_nothing_not_even_the_kb(tmp_path: Path) -> None:
    docs = write_files(tmp_path / "docs", {"a.md": many_leaves(2)})
    with opened(_settings(tmp_path / "data"), HashEncoder()) as resources:
        doc = load_document(docs / "a.md", root=docs)
        options = RunOptions(delete_missing=True, recreate=False, dry_run=False, limit=DeleteLimit(10))
        planned = plan_run(resources, "fresh", Scan(docs=(doc,)), options, signature="sig", read=lambda doc: doc)
        assert [item.doc.doc_id for item in planned.plan.to_write] == ["a.md"]
        assert (planned.failures, planned.notes) == ((), ())
        assert resources.documents.kbs.get_kb("fresh") is None
        assert resources.documents.versions.of_kb("fresh") == []


def test_planning_returns_what_the_report_is_to_say_and_the_run_puts_it_there(tmp_path: Path) -> None:
    """A document another root serves is a failure, a dry run's refused deletions a note: planning returns them
    (it has no report to write to), and the run lists them in its report."""
    docs = write_files(tmp_path / "docs", {f"{name}.md": many_leaves(1, name) for name in ("a", "b", "c", "d")})
    moved = write_files(tmp_path / "moved", {"a.md": many_leaves(1, "moved")})  # a.md again, from another folder
    with opened(_settings(tmp_path / "data"), HashEncoder()) as resources:
        indexer = Indexer(resources)
        assert indexer.index_paths([docs], kb_id="kb").added == 4
        write_files(docs, {"b.md": None, "c.md": None, "d.md": None})
        dry = RunOptions(delete_missing=True, recreate=False, dry_run=True, limit=DeleteLimit(10))
        scan_report = IndexReport(kb="kb")

        conflict = plan_run(
            resources, "kb", scan_paths([moved], scan_report), dry, signature="sig", read=lambda doc: doc
        )
        (failure,) = conflict.failures
        assert failure.source.endswith("a.md") and "already indexed from" in failure.reason
        assert conflict.plan.to_write == () and conflict.notes == ()

        refused = plan_run(resources, "kb", scan_paths([docs], scan_report), dry, signature="sig", read=lambda doc: doc)
        (note,) = refused.notes
        assert "would delete 3 document(s)" in note and "would be refused" in note and refused.plan.to_delete == ()
        assert scan_report.failed == 0 and scan_report.notes == []  # the scan's report: planning wrote nothing

        conflicted = indexer.index_paths([moved], kb_id="kb", dry_run=True)
        assert (conflicted.failed, conflicted.failures) == (1, [failure._asdict()])
        assert indexer.index_paths([docs], kb_id="kb", dry_run=True, delete_missing=True).notes == [note]


COUNTS = ("added", "updated", "unchanged", "deleted", "failed")


@pytest.mark.parametrize("recreate", [False, True], ids=["index", "recreate"])
def test_a_dry_run_counts_each_document_as_the_run_then_does(tmp_path: Path, recreate: bool) -> None:
    """Added, updated, unchanged, deleted and failed: the dry run's counts are the run's that follows it."""
    docs = write_files(tmp_path / "docs", {f"{name}.md": many_leaves(2, name) for name in ("kept", "edited", "gone")})
    with opened(_settings(tmp_path / "data"), HashEncoder()) as resources:
        indexer = Indexer(resources)
        assert indexer.index_paths([docs], kb_id="kb").added == 3
        write_files(docs, {"edited.md": many_leaves(3, "edited again"), "gone.md": None, "new.md": many_leaves(1)})
        if not recreate:  # a --recreate with a failure switches nothing (``test_pipeline``)
            write_files(docs, {"broken.md": "---\ntitle: [unclosed\n---\ntext\n"})
        options = {"delete_missing": True, "recreate": recreate}
        planned = indexer.index_paths([docs], kb_id="kb", dry_run=True, **options)
        done = indexer.index_paths([docs], kb_id="kb", **options)
    counts = [getattr(planned, name) for name in COUNTS]
    assert counts == [getattr(done, name) for name in COUNTS]
    assert counts == ([1, 2, 0, 1, 0] if recreate else [1, 1, 1, 1, 1])
    assert planned.chunks_written == 0 < done.chunks_written  # a dry run writes nothing


class StepLog:
    def __init__(self) -> None:
        self.steps: list[str] = []

    def __call__(self, step: str) -> None:
        if step != ENCODER_BATCH:
            self.steps.append(step)


@pytest.mark.parametrize("recreate", [False, True], ids=["index", "recreate"])
def test_one_loop_writes_small_and_large_documents_together(tmp_path: Path, recreate: bool) -> None:
    files = {"a.md": many_leaves(2, "export"), "b.md": many_leaves(3, "sync"), "big.md": many_leaves(12)}
    files["c.md"] = many_leaves(1, "tags")
    docs = write_files(tmp_path / "docs", files)
    log, progress = StepLog(), RecordingProgress()
    with opened(_settings(tmp_path / "data"), HashEncoder()) as resources:
        if recreate:
            Indexer(resources).index_paths([docs], kb_id="kb")
        recording = RecordingLeafIndex(resources.leaf_index)
        indexer = Indexer(with_parts(resources, leaf_index=recording), group_leaves=5, after_write_step=log)
        report = indexer.index_paths([docs], kb_id="kb", recreate=recreate, progress=progress)
        state = store_state(resources, "kb")
    state.assert_consistent()
    assert set(state.active.values()) == {2 if recreate else 1} and len(state.active) == 4
    assert (report.added + report.updated, report.failed, report.leaves_written) == (4, 0, 18)
    assert max(recording.upserts) <= 5 and sum(recording.upserts) == 18
    # a.md and b.md (held) are one group of 5 leaves; big.md (chunked again) is a group of its own, written in
    # batches; c.md the last group. Each serves once written, or the --recreate switch serves them all at the end.
    steps = [step for i, step in enumerate(log.steps) if i == 0 or log.steps[i - 1] != step]
    group = ["sql_pending", "milvus_upsert", "milvus_flush"]
    if recreate:
        assert steps == [*group, *group, *group, "activate", "retire_milvus", "retire_sql"]
    else:
        assert steps == [*group, "activate", *group, "activate", *group, "activate"]
    assert log.steps.count("sql_pending") >= 1 + 3 + 1
    written = [e[2:] for e in progress.events if e[0] == "written" and e[1] == "big.md"]
    assert written[-1] == (12, 12) and len(written) >= 3


def test_an_empty_or_oversized_kb_id_is_refused_as_an_invalid_argument(tmp_path: Path) -> None:
    with opened(_settings(tmp_path / "data"), HashEncoder()) as resources:
        indexer = Indexer(resources)
        with pytest.raises(InvalidArgumentError, match="must not be empty"):
            indexer.index_paths([tmp_path], kb_id=" ")
        with pytest.raises(InvalidArgumentError, match="over the limit"):
            indexer.index_paths([tmp_path], kb_id="k" * 10_000)
    with pytest.raises(InvalidArgumentError, match="--max-delete"):
        DeleteLimit(-1)
