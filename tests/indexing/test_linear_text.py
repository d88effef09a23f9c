"""Everything applied to a file's text is linear in its length: a megabyte of each pattern's worst input loads
and chunks (100 KB of spaces in one line once froze the service; a megabyte would have taken hours).

No test here times anything: a quadratic loader or chunker would take minutes to hours on these inputs, so a
regression shows as a run that does not end (the parse, in its child process, fails at ``parse_timeout_s``).
The rewritten patterns are also checked against the originals they replace, on short inputs where the
originals are fast, so that normal text is split exactly as before.
"""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata.config import ChunkingSettings
from strata.errors import LoaderError
from strata.indexing.chunking import _HEADING_MARKS, _SENTENCE_END, chunk_document
from strata.indexing.loaders import LoaderLimits, load_document
from strata.indexing.loaders._html import _BREAKS
from strata.indexing.loaders._markdown import _FENCE, _FRONT_MATTER, _atx_heading
from strata.indexing.loaders._text import _TRAILING_SPACES
from strata.types import Chunk, SourceDocument
from tests.pathological_text import NORMAL, PATHOLOGIES, Pathology, pathology

pytestmark = [pytest.mark.unit, pytest.mark.cost(20)]

MEGABYTE = 1024 * 1024
# Element counts are not what these tests are about (many_headings has 200k sections, the HTML ones 150k+
# markup objects): raised, so that each file reaches the chunker.
GENEROUS = LoaderLimits(max_elements=10_000_000)


def _load(tmp_path: Path, case: Pathology, size: int = MEGABYTE, limits: LoaderLimits = GENEROUS) -> SourceDocument:
    path = tmp_path / case.filename
    path.write_bytes(case.build(size))
    return load_document(path, limits=limits)


def _chunks(doc: SourceDocument) -> list[Chunk]:
    return chunk_document(doc, kb_id="kb", version=1, settings=ChunkingSettings())


def _visible(text: str) -> int:
    """Non-whitespace characters: what the leaves must hold between them, each once."""
    return len(text) - sum(text.count(c) for c in " \n")


@pytest.mark.parametrize("case", [*PATHOLOGIES, NORMAL], ids=lambda c: c.name)
def test_a_megabyte_of_the_worst_input_loads_and_chunks(tmp_path: Path, case: Pathology) -> None:
    doc = _load(tmp_path, case)
    chunks = _chunks(doc)
    leaves = [c for c in chunks if c.is_leaf]
    settings = ChunkingSettings()

    assert leaves, case.name
    assert all(c.text == doc.text[c.char_start : c.char_end] for c in chunks)
    assert max(len(c.text) for c in leaves) <= settings.l3_max_chars
    # Without overlap the leaves tile the text: nothing dropped, nothing twice.
    assert sum(_visible(c.text) for c in leaves) == _visible(doc.text)
    assert leaves[-1].char_end == len(doc.text)


def test_spaces_inside_a_line_are_kept_and_trailing_ones_dropped(tmp_path: Path) -> None:
    doc = _load(tmp_path, pathology("spaces"))
    body = doc.text.removeprefix("# Title\n\nhello")

    assert body.endswith("x") and set(body[:-1]) == {" "} and len(body) > MEGABYTE // 2
    assert [c.text for c in _chunks(doc) if c.is_leaf] == ["# Title\n\nhello", "x"]


def test_a_run_of_dots_is_one_sentence_cut_into_leaves(tmp_path: Path) -> None:
    doc = _load(tmp_path, pathology("dots"))
    leaves = [c for c in _chunks(doc) if c.is_leaf]

    assert doc.text.startswith("a...") and doc.text.endswith(".x")
    assert "".join(c.text for c in leaves) == doc.text  # hard cuts: no whitespace to cut at, none lost
    assert {len(c.text) for c in leaves[:-1]} <= {ChunkingSettings().l3_max_chars, 60}  # 300-char L2s: 120+120+60


def test_a_heading_with_a_long_run_of_spaces_is_still_a_heading(tmp_path: Path) -> None:
    doc = _load(tmp_path, pathology("heading_spaces"))
    (title,) = {s.heading_path for s in doc.sections}

    assert title[0].startswith("a ") and title[0].endswith(" x")
    assert [c.text for c in _chunks(doc) if c.is_leaf][-1].endswith("x\n\nbody")


def test_a_closing_sequence_is_not_part_of_the_title() -> None:
    assert _atx_heading("## Title " + "#" * 100_000 + "   ") == (2, "Title")
    assert _atx_heading("# a" + " #" * MEGABYTE + "x") == (1, "a" + " #" * MEGABYTE + "x")
    assert _atx_heading("#" * MEGABYTE + " x") is None


def test_an_unclosed_front_matter_is_body_text(tmp_path: Path) -> None:
    doc = _load(tmp_path, pathology("front_matter_unclosed"))

    assert doc.metadata == {} and doc.text.startswith("---\na: b\na: b")


@pytest.mark.parametrize(
    ("size", "reason"),
    [(60 * 1024, "front matter nested too deeply"), (MEGABYTE, r"front matter is [\d,]+ bytes, over the limit")],
)
def test_nested_brackets_in_a_front_matter_fail_with_a_reason(tmp_path: Path, size: int, reason: str) -> None:
    # PyYAML is not linear in flow nesting (4 KB of "{" take 0.7 s), which the front matter's size bounds.
    path = tmp_path / "nested.md"
    path.write_text("---\ntitle: " + "{" * size + "\n---\n# Body\n")
    with pytest.raises(LoaderError, match=reason):
        load_document(path, limits=GENEROUS)


def test_fences_hide_headings_at_any_length(tmp_path: Path) -> None:
    path = tmp_path / "fenced.md"
    path.write_text("`" * MEGABYTE + "\n# not a heading\n" + "`" * MEGABYTE + "\n# Heading\n\nbody\n")
    doc = load_document(path, limits=GENEROUS)

    assert [s.heading_path for s in doc.sections] == [(), ("Heading",)]


def test_html_break_marks_around_a_long_run_of_spaces(tmp_path: Path) -> None:
    doc = _load(tmp_path, pathology("pre_spaces"))

    assert doc.text.startswith("a ") and doc.text.endswith(" b") and set(doc.text[1:-1]) == {" "}


@pytest.mark.parametrize("name", ["html_comments", "html_unclosed_comments", "tag_soup", "end_tags"])
def test_unclosed_or_empty_html_markup_leaves_the_visible_text(tmp_path: Path, name: str) -> None:
    assert _load(tmp_path, pathology(name)).text == "x"


def test_a_megabyte_of_html_comments_is_refused_before_the_tree_is_built(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match=r"HTML has [\d,]+ tags, more than STRATA_INDEXING__MAX_ELEMENTS"):
        _load(tmp_path, pathology("html_comments"), limits=LoaderLimits())


def test_html_comments_allowed_by_the_limits_are_parsed_outside_this_process(tmp_path: Path) -> None:
    # 150,000 comments are 150,000 objects of the tree: built in the parse's child process, bounded by its
    # memory cap and given back when it exits, never in the process that serves requests.
    limits = LoaderLimits(max_elements=10_000_000, parse_max_memory_bytes=512 * 1024 * 1024)
    tracemalloc.start()
    try:
        doc = _load(tmp_path, pathology("html_comments"), limits=limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert doc.text == "x"
    assert peak < 16 * MEGABYTE, f"the parse allocated {peak:,} bytes in this process"


def test_html_comments_over_the_memory_cap_fail_with_the_setting(tmp_path: Path) -> None:
    limits = LoaderLimits(max_elements=10_000_000, parse_max_memory_bytes=64 * 1024 * 1024)
    with pytest.raises(LoaderError, match="STRATA_INDEXING__PARSE_MAX_MEMORY_BYTES"):
        _load(tmp_path, pathology("html_comments"), size=16 * MEGABYTE, limits=limits)


# --- the rewritten patterns split normal text as the originals did ------------------------------------------

_CLOSERS = "”’」』）》)\\]\"'"
_ORIGINALS = {
    "sentence end": re.compile(rf"[。！？；…]+[{_CLOSERS}]*|[.!?;]+[{_CLOSERS}]*(?=\s|\Z)|\n"),
    "heading marks": re.compile(r"^ {0,3}#{1,6} +| +#+ *$"),
    "trailing spaces": re.compile(r" +$", re.MULTILINE),
    "breaks": re.compile("[ \ue000\ue001]*[\ue000\ue001][ \ue000\ue001]*"),
    "atx heading": re.compile(r"^ {0,3}(#{1,6}) +(.*?)(?: +#+)? *$"),
    "front matter": re.compile(r"\A---[ \t]*\n(.*?)^---[ \t]*$\n?", re.DOTALL | re.MULTILINE),
    "fence": re.compile(r"^ {0,3}(`{3,}|~{3,})"),
}


def _texts(alphabet: str) -> st.SearchStrategy[str]:
    return st.text(alphabet=alphabet, max_size=24)


@settings(max_examples=400, deadline=None)
@given(_texts(' .!;a\n。)"x'), st.integers(0, 24), st.integers(0, 24))
def test_sentence_ends_are_the_originals_in_any_span(text: str, start: int, length: int) -> None:
    start = min(start, len(text))
    end = min(start + length, len(text))
    original = [m.span() for m in _ORIGINALS["sentence end"].finditer(text, start, end)]
    rewritten = [(start + m.start(), start + m.end()) for m in _SENTENCE_END.finditer(text[start:end])]
    assert rewritten == original


@settings(max_examples=400, deadline=None)
@given(_texts(" #a"))
def test_heading_marks_and_headings_are_the_originals(line: str) -> None:
    match = _ORIGINALS["atx heading"].match(line)
    assert _HEADING_MARKS.sub("|", line) == _ORIGINALS["heading marks"].sub("|", line)
    assert _atx_heading(line) == ((len(match.group(1)), match.group(2).strip()) if match else None)


@settings(max_examples=400, deadline=None)
@given(_texts(" \nab"), _texts(" \ue000\ue001ab\n"))
def test_trailing_spaces_and_breaks_are_the_originals(text: str, rendered: str) -> None:
    assert _TRAILING_SPACES.sub("|", text) == _ORIGINALS["trailing spaces"].sub("|", text)
    assert _BREAKS.sub("|", rendered) == _ORIGINALS["breaks"].sub("|", rendered)


@settings(max_examples=400, deadline=None)
@given(_texts("-- \t\nab`~"))
def test_front_matter_and_fences_are_the_originals(text: str) -> None:
    for name, rewritten, sample in (("front matter", _FRONT_MATTER, "---\n" + text), ("fence", _FENCE, text)):
        original = _ORIGINALS[name].match(sample)
        match = rewritten.match(sample)
        assert (match and (match.span(), match.groups())) == (original and (original.span(), original.groups()))
