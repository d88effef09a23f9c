"""``strata index`` on a real folder: a loader's notes (an unresolved MkDocs snippet, a docutils error) are
warnings of the report, per document, in ``--json`` and in the human report; the files are indexed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.documents import write_files
from tests.support.processes import run_strata, strata_env

pytestmark = pytest.mark.slow  # strata in processes of its own

INSTALL_MD = """\
---
title: Installing the harbour tools
---
# Installation

!!! note "Before you start"
    You need Python 3.11 and a network connection to the harbour office.

--8<-- "includes/proxy-settings.md"

## Verifying

??? warning

Run `harbour --version`; it prints the installed version.
"""

LAMP_RST = """\
Lamp room
=========

The lamp burns paraffin and is lit at dusk.

+-----------+----------------+
| Lens      | Fresnel, first |
| Period    | 30 s           |
+-----------+

Wicks
-----

Trim the wick before dusk.
"""

SNIPPET = "unresolved snippet 'includes/proxy-settings.md' (--8<--): not indexed (strata reads no other file)"
EMPTY_ADMONITION = "admonition '??? warning' has nothing indented under it: what follows is not part of it"
TABLE = (
    "docutils error at line 9: Malformed table. Right border not aligned or missing. "
    "(the table's lines are indexed as text, without its borders)"
)


def test_strata_index_reports_each_documents_notes_as_warnings(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(
        tmp_path / "docs",
        {"guide/install.md": INSTALL_MD, "lamp.rst": LAMP_RST, "clean.md": "# Clean\n\nNothing to note here.\n"},
    )
    install, lamp = str(docs / "guide" / "install.md"), str(docs / "lamp.rst")

    done = run_strata(["index", str(docs), "--kb", "noted", "--json"], env)

    assert done.returncode == 0, done.stderr  # a note does not fail the file
    report = json.loads(done.stdout)
    assert (report["added"], report["failed"], report["failures"], report["skipped"]) == (3, 0, [], [])
    assert report["warnings"] == [  # in the order the folder is walked: its files, then its folders'
        {"source": lamp, "note": TABLE},
        {"source": install, "note": SNIPPET},
        {"source": install, "note": EMPTY_ADMONITION},
    ]
    assert f"guide/install.md: {SNIPPET}" in done.stderr  # and logged as a warning naming the file

    plain = run_strata(["index", str(docs), "--kb", "noted"], env)  # unchanged files are read, and noted, again
    assert plain.returncode == 0, plain.stderr
    lines = plain.stdout.splitlines()
    assert "3 unchanged" in lines[0]
    assert [line for line in lines if line.startswith("  warning ")] == [
        f"  warning {lamp}: {TABLE}",
        f"  warning {install}: {SNIPPET}",
        f"  warning {install}: {EMPTY_ADMONITION}",
    ]

    found = run_strata(["query", "which lens does the lamp room use", "--kb", "noted", "--json", "--top-k", "1"], env)
    assert found.returncode == 0, found.stderr
    assert "Fresnel, first" in found.stdout  # the malformed table's text was indexed
