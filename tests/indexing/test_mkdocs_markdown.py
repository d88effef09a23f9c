"""MkDocs-flavoured Markdown (tests/fixtures/docs/mkdocs_install.md): admonitions and content tabs read as
text over their bodies, snippets reported instead of indexed, fenced code left alone, every new pattern
linear on a megabyte of its worst input."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.config import ChunkingSettings
from strata.errors import LoaderError
from strata.indexing.chunking import chunk_document
from strata.indexing.loaders import LoaderLimits, load_document
from strata.indexing.loaders._markdown import _ADMONITION, _SNIPPET, _SNIPPET_BLOCK, _TAB, parse_markdown
from strata.types import SourceDocument

pytestmark = [pytest.mark.unit]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "docs"
MEGABYTE = 1024 * 1024
GENEROUS = LoaderLimits(max_elements=10_000_000)


def _section_text(doc: SourceDocument, path: tuple[str, ...]) -> str:
    section = next(s for s in doc.sections if s.heading_path == path)
    return doc.text[section.start : section.end]


def _load(tmp_path: Path, text: str | bytes, limits: LoaderLimits = GENEROUS) -> SourceDocument:
    path = tmp_path / "page.md"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return load_document(path, limits=limits)


def test_a_mkdocs_page_reads_as_text_under_its_headings(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="strata.indexing.loaders"):
        doc = load_document(FIXTURES / "mkdocs_install.md")

    assert [s.heading_path for s in doc.sections] == [
        ("Installing the harbour tools",),
        ("Installation",),
        ("Installation", "Platform steps"),
        ("Installation", "Configuration"),
        ("Installation", "Configuration", "Verifying"),
    ]
    installation = _section_text(doc, ("Installation",))
    assert installation.startswith(
        "# Installation\n\nNote: Before you start\n"
        "    You need Python 3.11 and a network connection to the harbour office."
    )
    assert "Warning:\n    Uninstall any version older than 2.0 first." in installation
    assert "Tip: Faster downloads\n    Use the office mirror" in installation
    assert "    Danger: Never on the gallery\n        Do not run the installer" in installation  # nested
    steps = _section_text(doc, ("Installation", "Platform steps"))
    assert (
        "Tab: Linux\n\n    ```bash\n    # install with the package manager\n    sudo apt install harbour-tools" in steps
    )
    assert "Tab: macOS" in steps
    configuration = _section_text(doc, ("Installation", "Configuration"))
    assert (
        '# harbour.yml: this comment is not a heading\nlamp: fresnel\n!!! note "inside code stays as written"'
        in configuration
    )
    assert '--8<-- "example.md"' in configuration  # the escaped marker, one ";" less
    assert "| lamp    | fresnel |" in configuration
    for marker in (
        '!!! note "Before',
        "??? warning",
        "???+",
        '=== "Linux"',
        "proxy-settings",
        "abbreviations",
        "glossary.md",
    ):
        assert marker not in doc.text, marker
    assert [r.getMessage() for r in caplog.records] == [
        f"mkdocs_install.md: unresolved snippet 'includes/{name}.md' (--8<--): not indexed (strata reads no other file)"
        for name in ("proxy-settings", "abbreviations", "glossary")
    ]


def test_the_chunks_of_an_admonition_keep_its_label_and_heading_path() -> None:
    doc = load_document(FIXTURES / "mkdocs_install.md")
    leaves = [c for c in chunk_document(doc, kb_id="kb", version=1, settings=ChunkingSettings()) if c.is_leaf]

    holding = [c for c in leaves if "harbour office" in c.text]
    assert holding and all(c.heading_path == "Installation" for c in holding)
    assert any("Note: Before you start" in c.text for c in leaves)


@pytest.mark.parametrize(
    ("line", "text"),
    [
        ('!!! note "Title"', "Note: Title"),
        ("!!! danger", "Danger:"),
        ('??? question "Why?"', "Question: Why?"),
        ('???+ example inline end "Two classes"', "Example: Two classes"),
        ('!!! info ""', "Info:"),
        ('    !!! tip "Nested"', "    Tip: Nested"),
        ('=== "C++"', "Tab: C++"),
        ('===! "New set"', "Tab: New set"),
        ('===+ "Selected"', "Tab: Selected"),
        ("!!!note", "!!!note"),  # not a marker
        ("=== Linux", "=== Linux"),
        ("!!! note inline end", "Note:"),  # words after the type are CSS classes, as in pymdownx
        ('!!! "Title only"', '!!! "Title only"'),  # no type: not a marker
    ],
)
def test_marker_lines(line: str, text: str) -> None:
    assert parse_markdown(f"# H\n\n{line}\n    body\n".encode()).text == f"# H\n\n{text}\n    body"


def test_snippet_forms() -> None:
    page = (
        "a\n\n--8<-- 'single.md'\n-8<- \"short-dashes.md\"\n\n"
        "--8<--\nblock.md\n\n;skipped.md\n--8<--\n\n--8<--\nunclosed.md\n"
    )
    parsed = parse_markdown(page.encode())

    assert parsed.text == "a\n\n--8<--\nunclosed.md"  # an opener without a closer is text: nothing is swallowed
    *snippets, unclosed = parsed.notes
    assert [n.split("'")[1] for n in snippets] == ["single.md", "short-dashes.md", "block.md"]
    assert unclosed == "snippet block (--8<--) is never closed: its marker and the lines after it are kept as text"


def test_fenced_hashes_are_not_headings_in_any_fence() -> None:
    page = (
        "# A\n\n~~~\n# tilde\n~~~\n\n````md\n```\n# inner\n```\n````\n\n"
        "!!! note\n    ```\n    # in an admonition\n    ```\n\n## B\n"
    )
    parsed = parse_markdown(page.encode())

    assert [s.heading_path for s in parsed.sections] == [("A",), ("A", "B")]


def test_plain_markdown_is_unchanged_by_the_mkdocs_pass() -> None:
    page = (
        "# Title\n\nA line with !!! and ??? and === inside, and 8< too.\n\n=====\n\n"
        "    !!! not a marker? words after the type are classes, and '?' is none\n"
    )
    parsed = parse_markdown(page.encode())
    assert "A line with !!! and ??? and === inside, and 8< too." in parsed.text and parsed.notes == ()


# --- linear: a megabyte of each pattern's worst input -------------------------------------------------------------

# Each pattern matches a whole line; its worst input is a line that almost matches, as long as a megabyte: a run
# of what one of its repeated parts takes, ended by what makes it fail.
WORST_LINES = {
    "admonition_spaces": ("!!!" + " " * MEGABYTE + 'x y "t', _ADMONITION),
    "admonition_classes": ("!!! note" + " a" * (MEGABYTE // 2) + ' "t', _ADMONITION),
    "admonition_indent": (" " * MEGABYTE + "!!", _ADMONITION),
    "tab_spaces": ("===" + " " * MEGABYTE + '"t', _TAB),
    "snippet_dashes": ("-" * MEGABYTE + "8<" + "-" * MEGABYTE + ' "x', _SNIPPET),
    "snippet_block_dashes": ("-" * MEGABYTE + "8<" + "-" * MEGABYTE + " x", _SNIPPET_BLOCK),
    "snippet_escapes": (";" * MEGABYTE + "-8", _SNIPPET),
}


@pytest.mark.parametrize("name", list(WORST_LINES))
def test_a_megabyte_line_that_almost_matches_is_refused_in_one_pass(name: str) -> None:
    line, pattern = WORST_LINES[name]
    assert pattern.fullmatch(line) is None


@pytest.mark.parametrize(
    "unit",
    [
        '!!! note "a"\n    body\n',  # long admonition runs
        "!!! note\n" + "    body line\n" * 50,
        '=== "t"\n\n    tab body\n\n',
        '--8<-- "s.md"\n',  # a snippet a line: every line reported
        "--8<--\n",  # markers alone: pairs of empty blocks
        "```\n!!! note\n",  # fences and markers alternating
        "!!!" + " " * 1000 + "x\n",
    ],
    ids=["admonitions", "long_admonition", "tabs", "snippets", "snippet_markers", "fenced_markers", "near_miss"],
)
def test_a_megabyte_of_mkdocs_markup_loads_and_chunks(tmp_path: Path, unit: str) -> None:
    raw = unit * (MEGABYTE // len(unit))
    doc = _load(tmp_path, "# Page\n\n" + raw)
    chunks = chunk_document(doc, kb_id="kb", version=1, settings=ChunkingSettings())

    assert chunks and all(c.text == doc.text[c.char_start : c.char_end] for c in chunks)
    if unit.startswith("!!! note"):
        assert "!!! note" not in doc.text and doc.text.count("Note:") == MEGABYTE // len(unit)


def test_a_megabyte_of_admonitions_is_within_the_default_limits(tmp_path: Path) -> None:
    unit = '!!! warning "Gallery"\n    The rail is loose.\n\n'
    doc = _load(tmp_path, "# Page\n\n" + unit * (MEGABYTE // len(unit)), limits=LoaderLimits())
    assert doc.text.count("Warning: Gallery\n    The rail is loose.") == MEGABYTE // len(unit)


def test_a_megabyte_of_headings_is_refused_with_the_setting(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match=r"^Markdown has [\d,]+ sections, more than STRATA_INDEXING__MAX_ELEMENTS"):
        _load(tmp_path, "!!! note\n    x\n" + "## h\n" * (MEGABYTE // 5), limits=LoaderLimits())


# --- the patterns match as the simple ones they stand for ---------------------------------------------------------

_SIMPLE = {
    "admonition": (_ADMONITION, re.compile(r'( *)(!!!|\?\?\?\+?)[ ]+([\w-]+)(?:[ ]+[\w-]+)*(?:[ ]+"([^"\n]*)")?[ ]*')),
    "tab": (_TAB, re.compile(r'( *)===[!+]?[ ]+"([^"\n]*)"[ ]*')),
    "snippet": (_SNIPPET, re.compile(r" *(;*)-+8<-+[ ]+(\"[^\"\n]+\"|'[^'\n]+')[ ]*")),
    "snippet block": (_SNIPPET_BLOCK, re.compile(r" *(;*)-+8<-+[ ]*")),
}


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=" !?+=-8<;\"'anote", max_size=20))
def test_the_possessive_patterns_match_as_the_backtracking_ones(line: str) -> None:
    for name, (possessive, simple) in _SIMPLE.items():
        fast, slow = possessive.fullmatch(line), simple.fullmatch(line)
        assert (fast and fast.groups()) == (slow and slow.groups()), name


# --- a megabyte of a real page's markup: the heading hierarchy holds ---------------------------------------------


def _mkdocs_chapters(size: int) -> tuple[str, list[tuple[str, ...]]]:
    """A MkDocs page of nested headings, each section with admonitions (one nested, one collapsible), content
    tabs over fenced code, a snippet and a snippet block, and a fence holding markers and a ``#`` line; and
    the heading paths it must give. Each section's body holds a marker word (``c3s1u0``)."""
    parts, paths, total, i = [], [], 0, 0
    while total < size:
        chapter = f"Chapter {i}"
        parts.append(f"# {chapter}\n\nChapter {i} opens here, marker c{i}.\n\n")
        paths.append((chapter,))
        for j in range(2):
            section = f"Section {i}.{j}"
            parts.append(
                f'## {section}\n\n!!! note "Before you start"\n    Keep the lamp lit, marker c{i}s{j}.\n\n'
                '    !!! danger "Nested"\n        Not on the gallery.\n\n'
                '=== "Linux"\n\n    ```bash\n    sudo apt install lamp\n    ```\n\n'
                '=== "macOS"\n\n    ```bash\n    brew install lamp\n    ```\n\n'
                f'--8<-- "includes/c{i}s{j}.md"\n\n'
            )
            paths.append((chapter, section))
            for k in range(2):
                sub = f"Sub {i}.{j}.{k}"
                parts.append(
                    f"### {sub}\n\n???+ tip\n    Panels numbered, marker c{i}s{j}u{k}.\n\n"
                    '```yaml\n# not a heading\n!!! note "in code"\n```\n\n'
                    "--8<--\nincludes/abbreviations.md\n--8<--\n\n"
                )
                paths.append((chapter, section, sub))
        total += sum(len(part) for part in parts[-7:])
        i += 1
    return "".join(parts), paths


def test_a_megabyte_mkdocs_page_keeps_its_heading_hierarchy_and_bounds_its_notes(tmp_path: Path) -> None:
    page, paths = _mkdocs_chapters(MEGABYTE)
    chapters = len(paths) // 7
    assert len(page) >= MEGABYTE
    doc = _load(tmp_path, page, limits=LoaderLimits())  # the default bounds

    assert [s.heading_path for s in doc.sections] == paths
    for text, count in (
        ("Note: Before you start\n    Keep the lamp lit", 2 * chapters),
        ("    Danger: Nested\n        Not on the gallery.", 2 * chapters),
        ("Tab: Linux\n\n    ```bash\n    sudo apt install lamp", 2 * chapters),
        ("Tab: macOS", 2 * chapters),
        ("Tip:\n    Panels numbered", 4 * chapters),
        ('# not a heading\n!!! note "in code"', 4 * chapters),
    ):
        assert doc.text.count(text) == count, text
    assert "8<" not in doc.text and "includes/" not in doc.text
    assert len(doc.notes) == 21 and doc.notes[-1].startswith(f"{6 * chapters - 20:,} more notes like these")

    leaves = [c for c in chunk_document(doc, kb_id="kb", version=1, settings=ChunkingSettings()) if c.is_leaf]
    assert all(c.text == doc.text[c.char_start : c.char_end] for c in leaves)
    by_marker = {word: c.heading_path for c in leaves for word in re.findall(r"\bc\d+(?:s\d+(?:u\d+)?)?\b", c.text)}
    # each section's marker is in a leaf under that section's heading path, joined as the chunker joins it
    sub = paths[3]  # ("Chapter 0", "Section 0.0", "Sub 0.0.0")
    separator = by_marker["c0s0u0"].removeprefix(sub[0]).split(sub[1])[0]
    assert by_marker == {_marker(path): separator.join(path) for path in paths}


def _marker(path: tuple[str, ...]) -> str:
    """The marker word of a section: ``("Chapter 3", "Section 3.1", "Sub 3.1.0")`` holds ``c3s1u0``."""
    numbers = path[-1].split()[-1].split(".")
    return "".join(f"{letter}{n}" for letter, n in zip("csu", numbers))
