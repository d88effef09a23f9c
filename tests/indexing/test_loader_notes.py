"""A loader's notes (an unresolved include or snippet, markup the parser refused or left open) travel on the
``SourceDocument`` into the indexing report's ``warnings``, one entry a note naming the file; a file with
notes loads and is indexed. The commands and the upload route print them: tests/cli/test_index_notes_cli.py,
tests/api/test_upload_notes.py."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import pytest

from strata.cli.index_report import print_report
from strata.cli.remote_index import with_local_paths
from strata.indexing.loaders import MAX_NOTES, LoaderLimits, load_document
from strata.indexing.loaders._markdown import _UNCLOSED_TITLE
from strata.indexing.report import IndexReport
from strata.indexing.scan import scan_paths
from tests.support.documents import BROKEN_MKDOCS, BROKEN_MKDOCS_NOTES, BROKEN_RST, BROKEN_RST_NOTES, write_files

pytestmark = [pytest.mark.unit]

MEGABYTE = 1024 * 1024


def test_a_malformed_rst_table_loads_with_a_note_and_keeps_its_text(tmp_path: Path) -> None:
    doc = load_document(write_files(tmp_path, {"lamp.rst": BROKEN_RST}) / "lamp.rst")

    assert [s.heading_path for s in doc.sections] == [
        ("Lamp room",),
        ("Lamp room", "Wicks"),
        ("Lamp room", "Wicks", "Spare wicks"),
        ("Gallery",),
    ]
    # the rows are text as written, the borders are not
    assert "paraffin.\n\n| Lens      | Fresnel, first |\n| Period    | 30 s           |\n\nWicks" in doc.text
    assert "Skipped level\n\nThe rail is loose." in doc.text  # a refused title is text
    assert "*before dusk." in doc.text  # a warning: its text kept, and no note
    assert doc.notes == BROKEN_RST_NOTES


def test_a_mkdocs_page_with_markup_left_open_loads_with_a_note_each(tmp_path: Path) -> None:
    doc = load_document(write_files(tmp_path, {"install.md": BROKEN_MKDOCS}) / "install.md")

    assert [s.heading_path for s in doc.sections] == [
        ("Installing",),
        ("Installing", "Platforms"),
        ("Installing", "Snippets"),
    ]
    assert "Warning:\n\nUninstall the old tools first." in doc.text and "Tab: Linux\n\nRun the installer." in doc.text
    assert '!!! note "Before you start\n    You need Python 3.11.' in doc.text  # not a marker: as written
    assert doc.text.endswith("--8<--\nincludes/abbreviations.md")  # an unclosed block swallows nothing
    assert doc.notes == BROKEN_MKDOCS_NOTES


def test_a_code_fence_never_closed_is_noted_in_any_markdown(tmp_path: Path) -> None:
    page = "# Setup\n\n```bash\nsudo apt install lamp\n\n# Not a heading: still code\n"
    doc = load_document(write_files(tmp_path, {"setup.md": page}) / "setup.md")

    assert [s.heading_path for s in doc.sections] == [("Setup",)]
    assert doc.notes == ("code fence '```bash' is never closed: the rest of the page is read as code",)


def test_well_formed_markup_has_no_notes(tmp_path: Path) -> None:
    files = {
        "ok.md": '# A\n\n!!! note "T"\n    body\n\n=== "Linux"\n\n    run\n\n```\ncode\n```\n',
        "ok.rst": "A\n=\n\n.. note::\n\n   body\n\n+---+---+\n| a | b |\n+---+---+\n\n*unclosed emphasis\n",
    }
    folder = write_files(tmp_path, files)
    assert [load_document(folder / name).notes for name in files] == [(), ()]


def test_a_docutils_warning_is_no_note_and_its_markup_is_read_once(tmp_path: Path) -> None:
    page = "====\nShort overline\n====\n\nbody\n\nTitle\n----\n\n*unclosed\n"  # two titles docutils warns of
    doc = load_document(write_files(tmp_path, {"warned.rst": page}) / "warned.rst")

    assert (doc.text, doc.notes) == ("Short overline\n\nbody\n\nTitle\n\n*unclosed", ())
    assert [s.heading_path for s in doc.sections] == [("Short overline",), ("Short overline", "Title")]


def test_a_files_notes_are_bounded_and_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    page = "# Page\n\n" + "".join(f'--8<-- "part-{n}.md"\n' for n in range(500))
    with caplog.at_level(logging.WARNING, logger="strata.indexing.loaders"):
        doc = load_document(write_files(tmp_path, {"parts.md": page}) / "parts.md")

    assert len(doc.notes) == MAX_NOTES + 1 and "'part-19.md'" in doc.notes[MAX_NOTES - 1]
    assert doc.notes[-1] == f"480 more notes like these (only the first {MAX_NOTES} are listed)"
    assert len(caplog.records) == MAX_NOTES + 1  # logged as kept: not 500 lines


def test_a_megabyte_of_markers_left_open_loads_with_bounded_notes(tmp_path: Path) -> None:
    unit = '!!! note "a\n=== "t"\n!!! tip\n'  # an unclosed title, an empty tab and admonition
    page = "# Page\n\n" + unit * (MEGABYTE // len(unit))
    doc = load_document(write_files(tmp_path, {"open.md": page}) / "open.md", limits=LoaderLimits())

    assert doc.text.count("Tab: t") == MEGABYTE // len(unit) and len(doc.notes) == MAX_NOTES + 1


def test_the_unclosed_title_pattern_refuses_a_megabyte_line_in_one_pass() -> None:
    assert _UNCLOSED_TITLE.fullmatch("!!! note" + " a" * (MEGABYTE // 2) + ' "t') is not None
    assert _UNCLOSED_TITLE.fullmatch("!!!" + " " * MEGABYTE + "x y") is None
    assert _UNCLOSED_TITLE.fullmatch("===" + " " * MEGABYTE + "t") is None


# --- into the report --------------------------------------------------------------------------------------------


def test_a_scan_lists_each_note_of_a_file_it_read_as_a_warning_naming_it(tmp_path: Path) -> None:
    docs = write_files(
        tmp_path / "docs",
        {"guide/install.md": BROKEN_MKDOCS, "lamp.rst": BROKEN_RST, "clean.md": "# Clean\n\nNothing to say.\n"},
    )
    report = IndexReport(kb="kb")

    scan = scan_paths([docs], report)

    assert sorted(d.doc_id for d in scan.docs) == ["clean.md", "guide/install.md", "lamp.rst"]
    assert (report.failed, report.failures, report.skipped) == (0, [], [])
    by_file: dict[str, list[str]] = {}
    for warning in report.warnings:
        assert set(warning) == {"source", "note"}
        by_file.setdefault(warning["source"], []).append(warning["note"])
    assert set(by_file) == {str(docs / "guide" / "install.md"), str(docs / "lamp.rst")}
    assert len(by_file[str(docs / "guide" / "install.md")]) == 5 and len(by_file[str(docs / "lamp.rst")]) == 3
    assert report.to_dict()["warnings"] == report.warnings


def test_the_human_report_prints_a_warning_a_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("strata.cli.index_report.outcome_is_final", lambda: None)  # it would ignore SIGINT from now on
    report = IndexReport(kb="kb", added=1)
    report.warnings.append({"source": "docs/lamp.rst", "note": "docutils error at line 9: Malformed table."})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_report(report.to_dict(), as_json=False)

    assert "\n  warning docs/lamp.rst: docutils error at line 9: Malformed table.\n" in out.getvalue()


def test_a_report_from_the_server_names_warnings_by_their_local_paths(tmp_path: Path) -> None:
    report = IndexReport(kb="kb").to_dict()
    report["warnings"] = [{"source": "guide/install.md", "note": "unresolved snippet 'x.md'"}]

    local = with_local_paths(report, [("guide/install.md", tmp_path / "docs" / "guide" / "install.md")])

    assert local["warnings"] == [
        {"source": str(tmp_path / "docs" / "guide" / "install.md"), "note": "unresolved snippet 'x.md'"}
    ]
    older = {k: v for k, v in report.items() if k != "warnings"}  # a service before warnings: none, no error
    assert with_local_paths(older, [])["warnings"] == []
