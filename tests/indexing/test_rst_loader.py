"""reStructuredText: real pages (tests/fixtures/docs, see its README) load into the heading hierarchy
Markdown gives, with code, tables and admonitions as text, Sphinx markup tolerated, no file read, and a
megabyte of each worst case loaded or refused with one line naming the setting."""

from __future__ import annotations

import itertools
import logging
import re
import shutil
from pathlib import Path

import pytest

from strata.config import ChunkingSettings
from strata.errors import LoaderError
from strata.indexing.chunking import chunk_document
from strata.indexing.loaders import LoaderLimits, is_supported, load_document
from strata.indexing.loaders._rst import INLINE_PIECE_CHARS, _pieces, parse_rst
from strata.types import SourceDocument

pytestmark = [pytest.mark.unit, pytest.mark.cost(95)]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "docs"
MEGABYTE = 1024 * 1024
GENEROUS = LoaderLimits(max_elements=10_000_000)


def _load(tmp_path: Path, name: str, content: str | bytes, limits: LoaderLimits = LoaderLimits()) -> SourceDocument:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return load_document(path, limits=limits)


def _paths(doc: SourceDocument) -> list[tuple[str, ...]]:
    return [s.heading_path for s in doc.sections]


def _section_text(doc: SourceDocument, path: tuple[str, ...]) -> str:
    section = next(s for s in doc.sections if s.heading_path == path)
    return doc.text[section.start : section.end]


def _tiles(doc: SourceDocument) -> bool:
    spans = [(s.start, s.end) for s in doc.sections]
    return (
        spans[0][0] == 0 and spans[-1][1] == len(doc.text) and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    )


# --- the heading hierarchy is Markdown's ------------------------------------------------------------------------

RST_PAGE = """\
:title: Keeper's guide

Read this first.

=======
Station
=======

The station has one tower.

Lamp
----

Paraffin, then electric.

Mantles
^^^^^^^

Spare mantles are in the store.

Fog signal
----------

Two blasts a minute.

=====
Boats
=====

One boat, no motor.
"""

MARKDOWN_PAGE = """\
---
title: Keeper's guide
---
Read this first.

# Station

The station has one tower.

## Lamp

Paraffin, then electric.

### Mantles

Spare mantles are in the store.

## Fog signal

Two blasts a minute.

# Boats

One boat, no motor.
"""


def test_rst_sections_have_the_heading_paths_markdown_gives(tmp_path: Path) -> None:
    rst = _load(tmp_path, "guide.rst", RST_PAGE)
    markdown = _load(tmp_path, "guide.md", MARKDOWN_PAGE)

    assert (
        _paths(rst)
        == _paths(markdown)
        == [
            ("Keeper's guide",),
            ("Station",),
            ("Station", "Lamp"),
            ("Station", "Lamp", "Mantles"),
            ("Station", "Fog signal"),
            ("Boats",),
        ]
    )
    assert _tiles(rst)
    assert rst.metadata == markdown.metadata == {"title": "Keeper's guide"}
    assert _section_text(rst, ("Station", "Lamp", "Mantles")) == "Mantles\n\nSpare mantles are in the store.\n\n"
    assert "=====" not in rst.text and "^^^" not in rst.text


def test_any_adornment_style_nests_by_the_order_it_is_met(tmp_path: Path) -> None:
    # The same hierarchy with other characters (and an overline) in another order: docutils' nesting decides.
    page = "*****\nTop\n*****\n\nA\n+++\n\nDeep\n::::\n\ntext\n\nB\n+++\n\nmore\n\n*****\nNext\n*****\n\nend\n"
    doc = _load(tmp_path, "styles.rst", page)

    assert _paths(doc) == [("Top",), ("Top", "A"), ("Top", "A", "Deep"), ("Top", "B"), ("Next",)]


def test_a_title_that_skips_a_level_is_kept_as_text(tmp_path: Path) -> None:
    # docutils refuses it (a level-3 style right under a level-1 title) and keeps what follows in the section
    page = "Top\n===\n\nA\n---\n\nDeep\n~~~~\n\nz\n\nNext\n====\n\nn\n\nSkipped\n~~~~~~~\n\nbody\n"
    doc = _load(tmp_path, "skip.rst", page)

    assert _paths(doc) == [("Top",), ("Top", "A"), ("Top", "A", "Deep"), ("Next",)]
    assert _section_text(doc, ("Next",)) == "Next\n\nn\n\nSkipped\n\nbody"


def test_chunks_carry_the_heading_paths(tmp_path: Path) -> None:
    doc = _load(tmp_path, "guide.rst", RST_PAGE)
    chunks = chunk_document(doc, kb_id="kb", version=1, settings=ChunkingSettings())
    by_text = {c.text.strip(): c.heading_path for c in chunks if c.is_leaf}

    leaf_paths = {c.heading_path for c in chunks if c.is_leaf}
    markdown = chunk_document(
        _load(tmp_path, "guide.md", MARKDOWN_PAGE), kb_id="kb", version=1, settings=ChunkingSettings()
    )
    assert leaf_paths == {c.heading_path for c in markdown if c.is_leaf}
    assert any("Mantles" in path for path in leaf_paths)
    assert all(c.text == doc.text[c.char_start : c.char_end] for c in chunks)
    assert any("Spare mantles" in text for text in by_text)


# --- real pages -------------------------------------------------------------------------------------------------


def test_a_sphinx_page_keeps_code_tables_and_admonitions_as_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="strata.indexing.loaders"):
        doc = load_document(FIXTURES / "lighthouse_operations.rst")

    assert _paths(doc) == [
        ("Lighthouse operations manual",),
        ("Lighthouse basics",),
        ("Lighthouse basics", "Lens care"),
        ("Lighthouse basics", "Lens care", "Cleaning schedule"),
        ("Lighthouse basics", "Clockwork"),
        ("Lighthouse basics", "Clockwork", "Night watch"),
    ]
    assert doc.metadata == {
        "title": "Lighthouse operations manual",
        "author": "Harbour Board",
        "module": "lighthouse",
        "skill_points": ["lens care", "clockwork"],
    }
    lens = _section_text(doc, ("Lighthouse basics", "Lens care"))
    assert (
        '# polish the lens, one panel at a time\nfor panel in lens.panels:\n    panel.polish(cloth="chamois")' in lens
    )
    assert "New in version 2.1: Panels are numbered from the landward side." in lens
    basics = _section_text(doc, ("Lighthouse basics",))
    assert "Note: Never look into the lens while the lamp is lit." in basics
    assert "Warning: The gallery rail is loose on the north side." in basics
    assert "listed in the Admiralty List of Lights." in basics  # a substitution, replaced
    schedule = _section_text(doc, ("Lighthouse basics", "Lens care", "Cleaning schedule"))
    for row in (
        "Day | Task | Tool",
        "Friday | Oil the clockwork | Whale oil can",
        "Mantle | 12",
        "Saint Brendan | Ireland",
    ):
        assert row in schedule
    clockwork = _section_text(doc, ("Lighthouse basics", "Clockwork"))
    assert "crank = 40 turns\nweight = 3 m drop" in clockwork
    assert "See also: The maker's manual, chapter 4." in clockwork
    assert "Troubleshooting\n\nIf the weight stalls" in clockwork  # a Sphinx-design directive: title and content
    # Sphinx roles keep the text they show; navigation directives are dropped
    assert doc.text.startswith(
        "This manual covers the daily work of a keeper. See the lens chapter\nand /appendix/signals"
    )
    assert "lighthouse.clock.wind for the winding API" in doc.text
    for absent in (":ref:", "toctree", "maxdepth", "On this page", ":caption:", "linenos", "<script>", "alert"):
        assert absent not in doc.text, absent
    unread = "not indexed (strata reads no other file)"
    warnings = [r.getMessage().removesuffix(unread) for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "lighthouse_operations.rst: unresolved include 'shared/safety.rst' (line 90): ",
        "lighthouse_operations.rst: unresolved literalinclude '../scripts/wind.py' (line 92): ",
        "lighthouse_operations.rst: unresolved raw 'banner.html' (line 118): ",
        "lighthouse_operations.rst: unresolved csv-table 'tides.csv' (line 121): ",
    ]


def test_a_scikit_learn_dataset_page(tmp_path: Path) -> None:
    doc = load_document(FIXTURES / "sklearn_iris.rst")

    assert _paths(doc) == [("Iris plants dataset",)]
    assert "sepal length: | 4.3 | 7.9 | 5.84 | 0.83 | 0.7826" in doc.text  # a simple table
    assert "Creator: R.A. Fisher" in doc.text  # a field list in the body is text
    assert "References\n\n- Fisher, R.A." in doc.text  # an unknown directive (sphinx-design's dropdown)
    assert "  - Iris-Setosa" in doc.text  # a nested list, indented
    assert "iris_dataset" not in doc.text  # a label


def test_an_aws_cli_topic_page(tmp_path: Path) -> None:
    doc = load_document(FIXTURES / "awscli_s3_case_insensitivity.rst")

    assert _paths(doc) == [
        ("AWS CLI S3 Case-Insensitivity",),
        ("Case conflicts",),
        ("Detecting and handling case conflicts",),
        ("S3 Express directory buckets",),
    ]
    assert doc.metadata["related_command"] == "s3 cp, s3 sync, s3 mv"
    assert "aws s3 sync s3://examplebucket ./mylocaldir" in _section_text(doc, ("Case conflicts",))
    assert "1. Submit a download request for A.txt." in doc.text


# --- no file is read, no message leaks --------------------------------------------------------------------------


def test_includes_and_file_options_never_read_a_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "secret.txt").write_text("TOP SECRET CONTENT\n")
    (tmp_path / "secret.csv").write_text('"TOP SECRET","CELL"\n')
    page = (
        "Title\n=====\n\nbody\n\n.. include:: secret.txt\n\n.. include:: secret.txt\n   :literal:\n\n"
        ".. raw:: html\n   :file: secret.txt\n\n.. csv-table:: t\n   :file: secret.csv\n\n"
        ".. literalinclude:: secret.txt\n\n.. raw:: html\n   :url: http://127.0.0.1:9/x\n"
    )
    with caplog.at_level(logging.WARNING, logger="strata.indexing.loaders"):
        doc = _load(tmp_path, "page.rst", page)

    assert doc.text == "Title\n\nbody"
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 6 and all("unresolved" in n for n in notes)
    assert "unresolved raw 'http://127.0.0.1:9/x'" in notes[-1]


def test_malformed_rst_loads_without_docutils_messages(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    page = (
        "Title\n=====\n\n*unclosed emphasis and ``literal\n\n.. unknown-thing:: arg\n   :weird: 1\n\n   inner text\n\n"
        ".. code-block:: python\n   :no-such-option:\n\n   x = 1\n\n"
        "Inconsistent\n~~~~\n\nA |missing| substitution, a `broken ref`_ and :nosuch:`role text`.\n\n"
        "+---+\n| broken table\n\n.. [#] orphan footnote\n"
    )
    doc = _load(tmp_path, "bad.rst", page)

    assert "*unclosed emphasis and ``literal" in doc.text
    assert "arg\n\ninner text" in doc.text and "x = 1" in doc.text and "role text" in doc.text
    for leak in ("ERROR", "WARNING", "System Message", "Unknown directive", "Inline emphasis start-string", "<string>"):
        assert leak not in doc.text, leak
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_rst_is_a_supported_suffix() -> None:
    assert is_supported(Path("docs/INDEX.RST"))


# --- bounds -----------------------------------------------------------------------------------------------------


def test_a_line_over_docutils_limit_fails_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(
        LoaderError, match=r"^line 3 is 10,001 characters, over docutils' line-length limit \(10,000\)$"
    ):
        _load(tmp_path, "long.rst", "T\n=\n" + "a" * 10_001 + "\n")


def test_too_many_lines_fail_before_docutils_runs(tmp_path: Path) -> None:
    with pytest.raises(
        LoaderError, match=r"^reStructuredText has 200,001 lines, more than STRATA_INDEXING__MAX_ELEMENTS \(100,000\)$"
    ):
        _load(tmp_path, "lines.rst", "a\n" * 200_000)


def test_nesting_deeper_than_python_allows_fails_with_a_reason(tmp_path: Path) -> None:
    page = "".join(" " * (2 * i) + "- item\n" for i in range(400))
    with pytest.raises(LoaderError, match=r"^reStructuredText nested too deeply$"):
        _load(tmp_path, "deep.rst", page, limits=GENEROUS)


def test_inline_pieces_join_to_the_text_and_are_bounded() -> None:
    text = ("*a " * 700 + "\n") * 40 + "b" * 5000
    pieces = list(_pieces(text, INLINE_PIECE_CHARS))

    assert "".join(pieces) == text
    assert all(len(p) <= INLINE_PIECE_CHARS for p in pieces)
    assert all(p.endswith(("\n", " ")) for p in pieces if "b" not in p)  # cut at breaks while there are any
    assert sum("b" in p for p in pieces) == 5  # a run without one is cut at the size


def _run(unit: str, size: int = MEGABYTE, prefix: str = "") -> bytes:
    return (prefix + unit * max(1, (size - len(prefix)) // len(unit))).encode()


def _deep_sections(size: int) -> bytes:
    styles, parts, total = "=-~^\"'`#*+<>:._", [], 0
    while total < size:
        title = f"T{len(parts)}"
        parts.append(f"{title}\n{styles[len(parts) % len(styles)] * len(title)}\n\nx\n\n")
        total += len(parts[-1])
    return "".join(parts).encode()


# The worst input of each part of docutils a page can make work: inline markup starts that its inline parser
# rescans (stars, backquotes, references, URIs), a section per few bytes in 15 nested styles, a huge table,
# a long admonition. Each loads with the element bound raised (no test times anything: a superlinear parse
# ends at the parse's time limit, and fails), and, except the admonition, is refused by the default bound.
WORST = {
    "inline_stars": lambda n: _run("*a " * 26 + "\n", n),
    "inline_backquotes": lambda n: _run("`a " * 26 + "\n", n),
    "inline_references": lambda n: _run("a_ " * 26 + "\n", n),
    "uris": lambda n: _run("http://a " * 9 + "\n", n),
    "deep_sections": _deep_sections,
    "grid_table": lambda n: _run(
        "| a cell    | another   |\n+-----------+-----------+\n", n, "+-----------+-----------+\n"
    ),
    "admonition": lambda n: _run("   words of a long note\n", n, ".. note::\n\n"),
}


# A markup start never closed is a problematic node and an error message of docutils' tree: 350,000 of them
# (a megabyte of "*a ") need 1.5 GB, over the default memory bound, which fails the file with one line. A
# quarter of that against a bound of 128 MB fails the same way in a tenth of the time.
OVER_MEMORY = ("inline_stars", "inline_backquotes")


@pytest.mark.slow
@pytest.mark.parametrize("name", OVER_MEMORY)
def test_unclosed_markup_past_the_memory_bound_fails_with_the_memory_setting(tmp_path: Path, name: str) -> None:
    limits = LoaderLimits(max_elements=10_000_000, parse_timeout_s=300, parse_max_memory_bytes=128 * MEGABYTE)
    # the parse raises MemoryError ("parsing needed more memory than ...") or, now and then, CPython dies of it
    with pytest.raises(LoaderError, match=r"STRATA_INDEXING__PARSE_MAX_MEMORY_BYTES \(134,217,728 bytes\)"):
        _load(tmp_path, f"{name}.rst", WORST[name](MEGABYTE // 4), limits=limits)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in WORST if n not in OVER_MEMORY])
def test_a_megabyte_of_the_worst_input_loads(tmp_path: Path, name: str) -> None:
    raw = WORST[name](MEGABYTE)
    doc = _load(tmp_path, f"{name}.rst", raw, limits=LoaderLimits(max_elements=10_000_000, parse_timeout_s=300))

    assert doc.text and _tiles(doc)
    visible = re.sub(rb"[\s*`_=\-~^\"'#+<>:.|]", b"", raw)
    assert len(visible) // 2 <= len(re.sub(r"[\s*`_=\-~^\"'#+<>:.|]", "", doc.text)), "text was lost"


def test_a_megabyte_of_deep_sections_is_refused_by_the_default_bound(tmp_path: Path) -> None:
    with pytest.raises(
        LoaderError, match=r"^reStructuredText has [\d,]+ lines, more than STRATA_INDEXING__MAX_ELEMENTS"
    ):
        _load(tmp_path, "deep_sections.rst", _deep_sections(MEGABYTE))


def test_a_megabyte_long_admonition_loads_within_the_default_limits(tmp_path: Path) -> None:
    doc = _load(tmp_path, "admonition.rst", WORST["admonition"](MEGABYTE))
    assert (
        doc.text.startswith("Note: words of a long note\n  words of a long note\n") and doc.text.count("words") > 40_000
    )


def test_directives_past_the_time_limit_fail_with_the_setting(tmp_path: Path) -> None:
    # 80,000 directives in 80,000 lines: under the line bound, and each a state machine of docutils' own
    # (about 2 ms): the parse's time limit stops it.
    with pytest.raises(LoaderError, match=r"^parsing took longer than STRATA_INDEXING__PARSE_TIMEOUT_S \(5 s\)"):
        _load(tmp_path, "directives.rst", _run(".. note:: x\n"), limits=LoaderLimits(parse_timeout_s=5))


def test_parse_rst_in_process_restores_docutils() -> None:
    from docutils.parsers.rst import directives, roles

    before = (directives.directive, roles.role)
    parsed = parse_rst(b".. toctree::\n\n   a\n\nText :ref:`x`.\n")
    assert parsed.text == "Text x." and (directives.directive, roles.role) == before


def test_the_fixture_licences_are_noted() -> None:
    readme = (FIXTURES.parent / "README.md").read_text()
    for name in (
        "sklearn_iris.rst",
        "awscli_s3_case_insensitivity.rst",
        "lighthouse_operations.rst",
        "mkdocs_install.md",
    ):
        assert name in readme


def test_strata_index_indexes_an_rst_page_end_to_end(tmp_path: Path) -> None:
    from tests.support.processes import run_strata, strata_env

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(FIXTURES / "lighthouse_operations.rst", docs / "operations.rst")
    env = strata_env(tmp_path / "data")

    done = run_strata(["index", str(docs), "--kb", "rst", "--json"], env)
    assert done.returncode == 0, done.stderr
    assert '"added": 1' in done.stdout and '"failed": 0' in done.stdout
    assert "operations.rst: unresolved include 'shared/safety.rst'" in done.stderr

    found = run_strata(
        ["query", "how often is the Fresnel lens polished", "--kb", "rst", "--json", "--top-k", "1"], env
    )
    assert found.returncode == 0, found.stderr
    assert "Lens care" in found.stdout and "chamois" in found.stdout


# --- a megabyte of a real page's markup: the heading hierarchy holds ---------------------------------------------


def _title(text: str, adornment: str) -> str:
    return f"{text}\n{adornment * len(text)}\n\n"


def _chapters(size: int) -> tuple[str, str, list[tuple[str, ...]]]:
    """A reStructuredText page of nested sections, each with directives (note, code-block, versionadded, an
    unknown one), a literal block and grid and simple tables; the Markdown page of the same titles and words;
    and the heading paths both must give. Each section's body holds a marker word (``c3s1u0``)."""
    rst, markdown, paths, total, i = [], [], [], 0, 0
    while total < size:
        chapter = f"Chapter {i}"
        rst.append(_title(chapter, "=") + f"Chapter {i} opens here, marker c{i}.\n\n")
        markdown.append(f"# {chapter}\n\nChapter {i} opens here, marker c{i}.\n\n")
        paths.append((chapter,))
        for j in range(2):
            section = f"Section {i}.{j}"
            rst.append(
                _title(section, "-") + f".. note::\n\n   Keep the lamp lit, marker c{i}s{j}.\n\n"
                ".. code-block:: python\n   :linenos:\n\n   def wind(turns):\n       return turns * 40\n\n"
                "::\n\n   literal text of the log\n\n"
                "+--------+--------+\n| Day    | Task   |\n+========+========+\n| Monday | Polish |\n"
                "+--------+--------+\n\n"
            )
            markdown.append(
                f"## {section}\n\nNote: Keep the lamp lit, marker c{i}s{j}.\n\n"
                "```python\ndef wind(turns):\n    return turns * 40\n```\n\nliteral text of the log\n\n"
                "Day | Task\nMonday | Polish\n\n"
            )
            paths.append((chapter, section))
            for k in range(2):
                sub = f"Sub {i}.{j}.{k}"
                rst.append(
                    _title(sub, "~") + f".. versionadded:: 2.{k}\n   Panels numbered, marker c{i}s{j}u{k}.\n\n"
                    f".. dropdown:: More\n\n   Hidden text, marker d{i}s{j}u{k}.\n\n"
                    f"=====  =====\nA      B\n=====  =====\nx{i}     y{j}\n=====  =====\n\n"
                )
                markdown.append(
                    f"### {sub}\n\nNew in version 2.{k}: Panels numbered, marker c{i}s{j}u{k}.\n\n"
                    f"More\n\nHidden text, marker d{i}s{j}u{k}.\n\nA | B\nx{i} | y{j}\n\n"
                )
                paths.append((chapter, section, sub))
        total += sum(len(part) for part in rst[-7:])
        i += 1
    return "".join(rst), "".join(markdown), paths


def _leaf_paths_by_marker(doc: SourceDocument) -> dict[str, str]:
    leaves = [c for c in chunk_document(doc, kb_id="kb", version=1, settings=ChunkingSettings()) if c.is_leaf]
    assert all(c.text == doc.text[c.char_start : c.char_end] for c in leaves)
    return {word: c.heading_path for c in leaves for word in re.findall(r"\b[cd]\d+(?:s\d+(?:u\d+)?)?\b", c.text)}


@pytest.mark.slow
def test_a_megabyte_page_of_sections_directives_and_tables_gives_markdowns_hierarchy(tmp_path: Path) -> None:
    page, markdown, paths = _chapters(MEGABYTE)
    chapters = len(paths) // 7
    assert len(page) >= MEGABYTE and page.count("\n") < LoaderLimits().max_elements  # within the default bounds
    # docutils' time on a shared 2-core machine varies: the limit is raised, no figure is asserted
    doc = _load(tmp_path, "manual.rst", page, limits=LoaderLimits(parse_timeout_s=300))
    twin = _load(tmp_path, "manual.md", markdown)

    assert _paths(doc) == _paths(twin) == paths and _tiles(doc) and doc.notes == ()
    for text, count in (
        ("Note: Keep the lamp lit", 2 * chapters),
        ("def wind(turns):\n    return turns * 40", 2 * chapters),
        ("literal text of the log", 2 * chapters),
        ("Day | Task\nMonday | Polish", 2 * chapters),
        ("New in version 2.1: Panels numbered", 2 * chapters),
        ("More\n\nHidden text", 4 * chapters),
        ("A | B\nx", 4 * chapters),
    ):
        assert doc.text.count(text) == count, text
    last = paths[-1]
    assert _section_text(doc, last).startswith(f"{last[-1]}\n\nNew in version 2.1: Panels numbered, marker c")

    by_marker = _leaf_paths_by_marker(doc)
    assert len(by_marker) == 7 * chapters + 4 * chapters  # every section's marker, and the dropdowns'
    assert by_marker == _leaf_paths_by_marker(twin)  # each leaf under the heading path Markdown gives it
    assert by_marker["c0s1u1"].endswith("Sub 0.1.1") and by_marker["c0s1"].endswith("Section 0.1")
