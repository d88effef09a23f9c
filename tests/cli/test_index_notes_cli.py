"""``strata index`` on a real folder: a loader's notes (an unresolved MkDocs snippet, a docutils error) are
warnings of the report, per document, in ``--json`` and in the human report; the files are indexed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.documents import BROKEN_MKDOCS, BROKEN_MKDOCS_NOTES, BROKEN_RST, BROKEN_RST_NOTES, write_files
from tests.support.processes import run_strata, strata_env

pytestmark = pytest.mark.slow  # strata in processes of its own


def test_strata_index_reports_each_documents_notes_as_warnings(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(
        tmp_path / "docs",
        {"guide/install.md": BROKEN_MKDOCS, "lamp.rst": BROKEN_RST, "clean.md": "# Clean\n\nNothing to note here.\n"},
    )
    install, lamp = str(docs / "guide" / "install.md"), str(docs / "lamp.rst")

    done = run_strata(["index", str(docs), "--kb", "noted", "--json"], env)

    assert done.returncode == 0, done.stderr  # a note does not fail the file
    report = json.loads(done.stdout)
    assert (report["added"], report["failed"], report["failures"], report["skipped"]) == (3, 0, [], [])
    # in the order the folder is walked: its files, then its folders'
    noted = [(lamp, note) for note in BROKEN_RST_NOTES] + [(install, note) for note in BROKEN_MKDOCS_NOTES]
    assert report["warnings"] == [{"source": source, "note": note} for source, note in noted]
    assert f"guide/install.md: {BROKEN_MKDOCS_NOTES[0]}" in done.stderr  # and logged as a warning naming the file

    plain = run_strata(["index", str(docs), "--kb", "noted"], env)  # unchanged files are read, and noted, again
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert "3 unchanged" in lines[0]
    assert [line for line in lines if line.startswith("  warning ")] == [f"  warning {s}: {n}" for s, n in noted]

    found = run_strata(["query", "which lens does the lamp room use", "--kb", "noted", "--json", "--top-k", "1"], env)
    assert found.returncode == 0, found.stderr
    assert "Fresnel, first" in found.stdout  # the malformed table's text was indexed
