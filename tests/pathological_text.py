"""Text files built to make a loader or the chunker superlinear: the worst input of each pattern family.

Each ``Pathology`` writes a file of about ``size`` bytes whose body is one long run of what a regular
expression or a loop over the text rescans (spaces before a letter, dots before a letter, heading marks,
an unclosed front matter, HTML comments ...). A linear loader and chunker go through a megabyte of any of
them in well under a second; a quadratic one takes minutes. Shared by tests/indexing/test_linear_text.py,
tests/api/test_pathological_uploads.py and scripts/bench_text_linearity.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Pathology:
    """One worst case: its name, the file suffix it is loaded as, and its bytes for a size."""

    name: str
    suffix: str
    build: Callable[[int], bytes]
    families: str  # the patterns or loops it attacks

    @property
    def filename(self) -> str:
        return f"{self.name}{self.suffix}"


def _run(prefix: str, unit: str, size: int, suffix: str = "") -> bytes:
    """``prefix``, then ``unit`` repeated to about ``size`` bytes in all, then ``suffix``."""
    count = max(1, (size - len(prefix) - len(suffix)) // len(unit))
    return (prefix + unit * count + suffix).encode("utf-8")


PATHOLOGIES: tuple[Pathology, ...] = (
    Pathology("spaces", ".txt", lambda n: _run("# Title\n\nhello ", " ", n, "x"), "trailing spaces, soft cuts"),
    Pathology("dots", ".txt", lambda n: _run("a", ".", n, "x"), "sentence ends"),
    Pathology("closers", ".txt", lambda n: _run("a.", ")", n, "x"), "sentence ends (closing brackets)"),
    Pathology("one_word", ".txt", lambda n: _run("", "a", n), "hard cuts of a unit with no break"),
    Pathology("heading_spaces", ".md", lambda n: _run("# a", " ", n, "x\n\nbody"), "ATX headings, heading marks"),
    Pathology("heading_marks", ".md", lambda n: _run("# a", " #", n, "x\n\nbody"), "ATX closing sequence"),
    Pathology("hashes", ".md", lambda n: _run("", "#", n, "\n\nbody"), "ATX opening marks"),
    Pathology("many_headings", ".md", lambda n: _run("", "## h\n", n), "sections, heading-only regions"),
    Pathology("front_matter_unclosed", ".md", lambda n: _run("---\n", "a: b\n", n), "front matter"),
    Pathology("front_matter_spaces", ".md", lambda n: _run("---\n---", " ", n, "x\nbody"), "front matter fence"),
    Pathology("fences", ".md", lambda n: _run("", "```\n", n), "fenced code"),
    Pathology("long_fence", ".md", lambda n: _run("", "`", n, "\nbody"), "fenced code"),
    Pathology("pre_spaces", ".html", lambda n: _run("<pre>a", " ", n, "b</pre>"), "HTML break marks"),
    Pathology("html_comments", ".html", lambda n: _run("<p>x</p>", "<!---->", n), "HTML comments (the comment bomb)"),
    Pathology("html_unclosed_comments", ".html", lambda n: _run("<p>x</p>", "<!--x>", n), "HTML comments never closed"),
    Pathology("tag_soup", ".html", lambda n: _run("<p>x</p>", "<a", n), "HTML start tags never closed"),
    Pathology("end_tags", ".html", lambda n: _run("<p>x</p>", "</", n), "HTML end tags never closed"),
)

_NORMAL_SECTION = (
    "## A section\n\nThe keeper polishes the Fresnel lens every Tuesday. Ships pass at night, "
    "and the light turns twice a minute; its clockwork is wound by hand.\n\n"
    "- a list item\n- another, with a comma, and more words\n\n"
)
NORMAL = Pathology(
    "normal",
    ".md",
    lambda n: _run("---\ntitle: Guide\n---\n# Guide\n\n", _NORMAL_SECTION, n),
    "a document as people write them",
)


def pathology(name: str) -> Pathology:
    """The input named ``name`` (``NORMAL`` included)."""
    return next(p for p in (*PATHOLOGIES, NORMAL) if p.name == name)
