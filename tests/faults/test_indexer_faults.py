"""Fault matrix, indexing: ``strata index`` SIGKILLed after each write step, and the disk filling up mid-write.

After the fault, ``strata reconcile --repair`` and a rerun leave exactly the
stores of a clean run (SQL versions and chunks, Milvus leaves). The crash
fixtures and documents are those of ``tests/indexing/test_pipeline.py``
(which checks what is served between the crash and the rerun); here the
baseline and the clean run are built in-process, and only the run that
crashes is a ``strata`` process of its own.

Disk full is real: the SQLite database lives on a small ``tmpfs`` mounted
for the test (root only; the test is skipped with the reason elsewhere).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.indexing.pipeline import WRITE_STEPS, Indexer
from strata.rag.retrieve import Retriever
from tests.support.crash import BEFORE_ACTIVATION, CRASH_KB, CRASH_QUERY, CRASH_UPDATE, CRASH_V1, crash_copy
from tests.support.documents import write_files
from tests.support.milvus import MilvusTarget
from tests.support.processes import run_strata, run_strata_killed_at, strata_env
from tests.support.snapshots import StoreState, assert_equal_but_renumbered, store_state
from tests.support.stores import opened, settings_for

pytestmark = [pytest.mark.slow, pytest.mark.cost(70)]  # the crash matrix: strata index SIGKILLed at each write step


def index_in_process(docs: Path, env: dict[str, str], encoder: Any) -> StoreState:
    with opened(settings_for(env), encoder) as resources:
        report = Indexer(resources).index_paths([docs], kb_id=CRASH_KB)
        assert report.failed == 0, report.failures
        state = store_state(resources, CRASH_KB)
    state.assert_consistent()
    return state


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory, memo_encoder: Any) -> tuple[Path, StoreState]:
    """Version 1 of the three-file kb (docs and stores), copied by every crash test."""
    root = tmp_path_factory.mktemp("faults-baseline")
    docs = write_files(root / "docs", CRASH_V1)
    return root, index_in_process(docs, strata_env(root / "data"), memo_encoder)


@pytest.fixture(scope="module")
def clean(baseline: tuple[Path, StoreState], tmp_path_factory: pytest.TempPathFactory, memo_encoder: Any) -> StoreState:
    """The stores after the update ran without a fault."""
    docs, env = crash_copy(baseline[0], tmp_path_factory.mktemp("faults-clean"), MilvusTarget("lite"), memo_encoder)
    state = index_in_process(docs, env, memo_encoder)
    assert state.active == {"retention.md": 2, "shortcuts.md": 1, "export.md": 1}
    return state


@pytest.mark.parametrize("step", WRITE_STEPS)
def test_sigkill_at_each_write_step_then_reconcile_repair_and_rerun_equal_a_clean_run(
    step: str,
    baseline: tuple[Path, StoreState],
    clean: StoreState,
    tmp_path: Path,
    memo_encoder: Any,
    module_milvus_target: MilvusTarget,
) -> None:
    """On a Lite file and on a Milvus server; the clean run it is compared with ran on a Lite file."""
    docs, env = crash_copy(baseline[0], tmp_path, module_milvus_target, memo_encoder)
    killed = run_strata_killed_at(step, ["index", str(docs), "--kb", CRASH_KB], env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr

    with opened(settings_for(env), memo_encoder) as resources:
        indexer = Indexer(resources)
        found = indexer.reconcile(CRASH_KB)
        repaired = indexer.reconcile(CRASH_KB, repair=True)
        repaired_state = store_state(resources, CRASH_KB)
        after_repair = indexer.reconcile(CRASH_KB)
        served = Retriever(resources).retrieve(CRASH_QUERY, 5, kb_ids=[CRASH_KB])
        rerun = indexer.index_paths([docs], kb_id=CRASH_KB)
        final = store_state(resources, CRASH_KB)
        final_check = indexer.reconcile(CRASH_KB)

    activated = step not in BEFORE_ACTIVATION
    # what the crash left: a pending version (before activation) or a retired one (after), unless it was done
    assert found.leftover_versions == (0 if step == "retire_sql" else 1), found.to_dict()
    assert (repaired.repaired, repaired.leftover_versions) == (True, found.leftover_versions)
    assert after_repair.differences == 0 and after_repair.to_dict()["notes"] == []
    repaired_state.assert_consistent()
    assert repaired_state == (clean if activated else baseline[1]), "repair finishes or undoes the interrupted write"
    assert (served.meta.status, served.meta.degraded) == ("ok", ())
    assert {d.metadata["version"] for d in served.docs if d.metadata["doc_id"] == "retention.md"} == {
        2 if activated else 1
    }

    assert (rerun.updated, rerun.unchanged, rerun.failed) == ((0, 3, 0) if activated else (1, 2, 0))
    assert final_check.differences == 0
    if activated:
        assert final == clean
    else:  # the crashed run's version 2 never served, and its number is never given again
        assert_equal_but_renumbered(final, clean, "retention.md", 3)


# -- disk full ---------------------------------------------------------------------------------

LOGBOOK = "\n".join(
    f"## Entry {n}\n\nDay {n}: the tide rose {n % 7} metres, wind from bearing {n * 13 % 360}, {n * 3 % 11} ships "
    f"passed and the lamp used {n * 17 % 50} litres of oil.\n"
    for n in range(30)
)  # many distinct leaves: embedding-cache rows and chunk rows far beyond the space left


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test (unmounted afterwards)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a size-limited tmpfs here ({done.stderr.strip()}); disk full is not simulated")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave_bytes: int) -> Path:
    """A file that takes all but ``leave_bytes`` of the free space."""
    stats = os.statvfs(disk)
    filler = disk / "filler"
    with open(filler, "wb") as out:
        out.write(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave_bytes))
    return filler


def test_disk_full_during_a_write_then_rerun_and_reconcile_repair_equal_a_clean_run(
    small_disk: Path, tmp_path: Path, memo_encoder: Any, clean: StoreState
) -> None:
    env = strata_env(tmp_path / "data", STRATA_DATABASE__URL=f"sqlite:///{small_disk / 'strata.sqlite3'}")
    docs = write_files(tmp_path / "docs", CRASH_V1)
    index_in_process(docs, env, memo_encoder)
    write_files(docs, {**CRASH_UPDATE, "logbook.md": "# Logbook\n\n" + LOGBOOK})
    filler = fill(small_disk, leave_bytes=128 * 1024)

    full = run_strata(["index", str(docs), "--kb", CRASH_KB, "--json"], env)
    assert full.returncode == 1, full.stdout
    assert "database or disk is full" in full.stderr, full.stderr[-2000:]
    with opened(settings_for(env), memo_encoder) as resources:  # reading needs no space: v1 keeps serving
        served = Retriever(resources).retrieve(CRASH_QUERY, 5, kb_ids=[CRASH_KB])
    assert (served.meta.status, served.meta.degraded) == ("ok", ())
    assert {d.metadata["version"] for d in served.docs if d.metadata["doc_id"] == "retention.md"} == {1}

    filler.unlink()
    rerun = run_strata(["index", str(docs), "--kb", CRASH_KB, "--json"], env)
    assert rerun.returncode == 0, rerun.stderr
    repaired = run_strata(["reconcile", "--kb", CRASH_KB, "--repair", "--json"], env)
    assert repaired.returncode == 0 and json.loads(repaired.stdout)["repaired"], repaired.stderr

    clean_root = tmp_path / "clean"
    clean_docs = write_files(clean_root / "docs", {**CRASH_V1})
    clean_env = strata_env(clean_root / "data")
    index_in_process(clean_docs, clean_env, memo_encoder)
    write_files(clean_docs, {**CRASH_UPDATE, "logbook.md": "# Logbook\n\n" + LOGBOOK})
    expected = index_in_process(clean_docs, clean_env, memo_encoder)
    with opened(settings_for(env), memo_encoder) as resources:
        state = store_state(resources, CRASH_KB)
        checked = Indexer(resources).reconcile(CRASH_KB)
    assert checked.differences == 0, checked.to_dict()
    state.assert_consistent()
    assert state == expected
    assert expected.active == {**clean.active, "logbook.md": 1}
    shutil.rmtree(clean_root)
