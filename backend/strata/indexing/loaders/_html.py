"""HTML loader: the visible text, split into sections at ``<h1>``-``<h3>``.

Scripts, styles and other invisible elements are dropped; block elements break
lines or paragraphs, and ``<pre>`` keeps its whitespace. The markup is counted
(a start tag, comment, declaration or processing instruction is ``<`` and a
letter, ``!`` or ``?``) before BeautifulSoup builds its tree, whose objects cost
far more than the bytes they came from: 11 MB of empty comments ``<!---->``
were 1.6 million objects, 37 s and 800 MB.

The tree is built by lxml (libxml2, in C), linear on every input measured
(``scripts/bench_text_linearity.py``). Python's ``html.parser`` is not: in the
Python 3.11.7 strata runs on, a construct that is never closed (``<a<a<a``,
``</</</``, ``<!--x>`` repeated) is rescanned to the end of the page from each
of its starts, so 100 KB of ``<a`` took 5 s. On well-formed pages both give the
same text (301 pages of HTML documentation compared: identical); on tag soup
lxml follows the HTML rules (a ``<p>`` ends where a ``<div>`` starts,
``<textarea>`` holds text).
"""

from __future__ import annotations

import re

from bs4 import BeautifulSoup, NavigableString, Tag

from strata.errors import LoaderError
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.loaders._text import Parsed, assemble, heading_parts

_HTML_DROPPED = frozenset({"script", "style", "noscript", "template", "head", "title", "iframe", "svg"})
_HTML_HEADINGS = {"h1": 1, "h2": 2, "h3": 3}
_HTML_PARAGRAPHS = frozenset(
    {
        "p",
        "pre",
        "blockquote",
        "table",
        "ul",
        "ol",
        "dl",
        "h4",
        "h5",
        "h6",
        "hr",
        "section",
        "article",
        "header",
        "footer",
        "figure",
        "main",
        "aside",
        "nav",
        "address",
        "details",
        "form",
        "fieldset",
    }
)
_HTML_LINES = frozenset({"div", "li", "tr", "td", "th", "dt", "dd", "caption", "figcaption", "summary", "br", "body"})
# Private-use marks stand for breaks while rendering, so that the whitespace
# around a break (source indentation) can be dropped in one substitution.
_LINE_MARK, _PARAGRAPH_MARK, _HEADING_MARK = "\ue000", "\ue001", "\ue002"
_BREAK_MARKS = _LINE_MARK + _PARAGRAPH_MARK
# A break and the spaces around it. Only a run's first space may start a match: "[ marks]*" would rescan a
# run of spaces without a break from each of its spaces (quadratic: 8k spaces in a <pre> took 0.3 s).
_BREAKS = re.compile(f"(?<! ) *+[{_BREAK_MARKS}][ {_BREAK_MARKS}]*+")
_MARKS_IN_SOURCE = re.compile("[\ue000-\ue002]")  # removed from the page text so they cannot be misread
_WHITESPACE_RUN = re.compile(r"\s+")
_MARKUP = re.compile(rb"<[A-Za-z!?]")  # what becomes an object of the tree: an element, a comment, a declaration


def parse_html(raw: bytes, limits: LoaderLimits = LoaderLimits()) -> Parsed:
    """HTML: ``<title>`` as metadata and preamble heading, one section per ``<h1>``-``<h3>``."""
    if b"\x00" in raw:
        raise LoaderError("binary file (contains NUL bytes)")
    limits.check_elements("HTML tags", sum(1 for _ in _MARKUP.finditer(raw)))  # comments count as tags
    soup = BeautifulSoup(raw, "lxml")  # detects the encoding from <meta charset> or the bytes
    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    rendered: list[str] = []
    try:
        _render_html(soup, rendered, in_pre=False)
    except RecursionError:
        raise LoaderError("HTML nested too deeply") from None
    text = _BREAKS.sub(lambda m: "\n\n" if _PARAGRAPH_MARK in m.group() else "\n", "".join(rendered))
    lines = (_html_line(line) for line in text.split("\n"))
    text, sections = assemble(heading_parts(lines, (title,) if title else ()))
    return Parsed(text, sections, {"title": title} if title else {})


def _html_line(line: str) -> tuple[int | None, str]:
    if line.startswith(_HEADING_MARK):
        return int(line[1]), line[2:]
    return None, line


def _render_html(node: Tag, out: list[str], *, in_pre: bool) -> None:
    """Append the visible text of ``node``, with marks where blocks break lines."""
    for child in node.children:
        if isinstance(child, Tag):
            _render_tag(child, out, in_pre=in_pre)
        elif type(child) is NavigableString:  # subclasses are comments, doctypes, CDATA
            visible = _MARKS_IN_SOURCE.sub("", child)
            out.append(visible if in_pre else _WHITESPACE_RUN.sub(" ", visible))


def _render_tag(tag: Tag, out: list[str], *, in_pre: bool) -> None:
    if tag.name in _HTML_DROPPED:
        return
    if tag.name in _HTML_HEADINGS:
        title = " ".join(tag.get_text(" ").split())
        out.append(f"{_PARAGRAPH_MARK}{_HEADING_MARK}{_HTML_HEADINGS[tag.name]}{title}{_PARAGRAPH_MARK}")
        return
    mark = _PARAGRAPH_MARK if tag.name in _HTML_PARAGRAPHS else _LINE_MARK if tag.name in _HTML_LINES else ""
    out.append(mark)
    _render_html(tag, out, in_pre=in_pre or tag.name == "pre")
    out.append(mark)
