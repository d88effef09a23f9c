"""Markdown and plain text loaders.

Markdown may open with YAML front matter (its values become the metadata) and
is split into sections at ATX headings outside fenced code blocks; plain text
is one section with heading path ``()``.

MkDocs (Material, pymdownx) markup reads as text: an admonition's marker line
``!!! note "Title"`` (or ``??? warning``, ``???+ tip``) becomes ``Note: Title``
and a content tab's ``=== "Linux"`` becomes ``Tab: Linux``, each over its
indented body, kept as it is; in fenced code they stay as written. A snippet
(``--8<-- "file.md"``, or a ``--8<--`` block of file names) names another
file, which strata does not read: its lines are dropped from the text and each
file is reported as an unresolved note. As in pymdownx, snippets are found in
code too, and ``;--8<--`` is the escaped marker, kept with one ``;`` less.

Markup left open is kept as text and noted, quoting its line: an admonition or
tab with nothing indented under it, a marker whose quoted title has no closing
quote (MkDocs does not read it as one either), a snippet block without its
closing ``--8<--``, and a code fence never closed (the rest of the page is code,
as in CommonMark, so its headings are not sections).

Front matter is untrusted input: it is bounded (``FRONT_MATTER_MAX_BYTES``)
and may not use YAML aliases. ``yaml.safe_load`` shares an aliased value
rather than copying it, but the metadata is plain JSON, where each alias is a
copy: a few hundred bytes of nested aliases ("billion laughs") would expand
into gigabytes. Front matter has no need for them, so a file using one fails
with that reason instead.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterator
from typing import Any

import yaml

from strata.errors import LoaderError
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.loaders._text import LINE_BREAKS, Parsed, decode_text, normalize_text, push_heading, tiled
from strata.types import Section

FRONT_MATTER_MAX_BYTES = 64 * 1024  # generous: real front matter is a few hundred bytes

# Linear on any text: the lazy body tries the closing "---" at line starts only, each try bounded by its
# line; a fence is matched at a line's start only.
_FRONT_MATTER = re.compile(r"\A---[ \t]*+\n(.*?)^---[ \t]*+$\n?", re.DOTALL | re.MULTILINE)
_FENCE = re.compile(r"^ {0,3}(`{3,}+|~{3,}+)")
# MkDocs markers, each matched whole against one line; every run is possessive and the runs that follow
# one another are of disjoint characters, so a line is scanned once.
_ADMONITION = re.compile(r"( *+)(!!!|\?\?\?\+?)[ \t]++([\w-]++)(?:[ \t]++[\w-]++)*+(?:[ \t]++\"([^\"\n]*+)\")?[ \t]*+")
_TAB = re.compile(r"( *+)===[!+]?[ \t]++\"([^\"\n]*+)\"[ \t]*+")
_SNIPPET = re.compile(r" *+(;*+)-++8<-++[ \t]++(\"[^\"\n]++\"|'[^'\n]++')[ \t]*+")
_SNIPPET_BLOCK = re.compile(r" *+(;*+)-++8<-++[ \t]*+")
# A marker whose quoted title is never closed ('!!! note "Title', '=== "Linux'): not a marker, in MkDocs either.
_UNCLOSED_TITLE = re.compile(r" *+(?:(?:!!!|\?\?\?\+?)[ \t]++[\w-]++(?:[ \t]++[\w-]++)*+|===[!+]?)[ \t]++\"[^\"\n]*+")
QUOTED_CHARS = 80  # a line quoted in a note, at most


def parse_text(raw: bytes) -> Parsed:
    """Plain text: one section covering the whole normalized text."""
    # Heading path () rather than the file stem: no invented headings; the
    # source path travels in every chunk's metadata anyway.
    text = normalize_text(decode_text(raw))
    return Parsed(text, (Section((), 0, len(text)),) if text else (), {})


def parse_plain_text(raw: bytes, limits: LoaderLimits = LoaderLimits()) -> Parsed:
    """``parse_text`` as a loader calls it: one section, nothing to count against ``limits``."""
    return parse_text(raw)


def parse_markdown(raw: bytes, limits: LoaderLimits = LoaderLimits()) -> Parsed:
    """Markdown: front matter as metadata, one section per ATX heading (and one for a preamble)."""
    text = LINE_BREAKS.sub("\n", decode_text(raw))
    metadata, body = _split_front_matter(text)
    body, notes = _mkdocs_markup(normalize_text(body))
    title = metadata.get("title")
    preamble_path = (str(title).strip(),) if title not in (None, "") else ()
    unclosed: list[str] = []
    sections = _markdown_sections(body, preamble_path, unclosed)
    limits.check_elements("Markdown sections", len(sections))  # the parse is linear; what follows is per section
    fence = [f"code fence {_quoted(line)} is never closed: the rest of the page is read as code" for line in unclosed]
    return Parsed(body, sections, metadata, (*notes, *fence))


def _split_front_matter(text: str) -> tuple[dict[str, Any], str]:
    match = _FRONT_MATTER.match(text)
    if match is None:
        return {}, text
    size = len(match.group(1).encode("utf-8"))
    if size > FRONT_MATTER_MAX_BYTES:
        raise LoaderError(f"front matter is {size} bytes, over the limit of {FRONT_MATTER_MAX_BYTES}")
    loaded = _load_front_matter(match.group(1))
    if not isinstance(loaded, dict):
        raise LoaderError("front matter is not a mapping of keys to values")
    try:
        return normalized_metadata(loaded), text[match.end() :]
    except RecursionError:
        raise LoaderError("front matter nested too deeply") from None


def _load_front_matter(yaml_text: str) -> Any:
    try:
        return yaml.load(yaml_text, Loader=_FrontMatterLoader) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""  # +2: 1-based, after the '---'
        raise LoaderError(f"malformed YAML front matter{where}: {getattr(exc, 'problem', None) or exc}") from exc
    except RecursionError:
        raise LoaderError("front matter nested too deeply") from None


class _FrontMatterLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (see the module docstring)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            line = event.start_mark.line + 2 if event.start_mark is not None else 0  # as in malformed YAML
            raise LoaderError(
                f"front matter uses a YAML alias (*{event.anchor} at line {line}); aliases are not allowed there"
            )
        return super().compose_node(parent, index)


def normalized_metadata(loaded: dict[Any, Any]) -> dict[str, Any]:
    """JSON-safe values; ``module`` a string, point lists lists of strings; nulls dropped for those.

    Front matter's rules, shared by reStructuredText's opening field list."""
    metadata = {str(k): _json_value(v) for k, v in loaded.items()}
    if metadata.get("module") is not None:
        if isinstance(metadata["module"], (list, dict)):
            raise LoaderError("front matter 'module' must be a single value")
        metadata["module"] = str(metadata["module"]).strip()
    for key in ("module", "skill_points", "score_points"):
        if key in metadata and metadata[key] is None:
            del metadata[key]
    for key in ("skill_points", "score_points"):
        if key in metadata:
            values = metadata[key] if isinstance(metadata[key], list) else [metadata[key]]
            metadata[key] = [str(v).strip() for v in values if v is not None and str(v).strip()]
    return metadata


def _json_value(value: Any) -> Any:
    if isinstance(value, (dt.date, dt.time)):  # dt.datetime is a dt.date
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_value(v) for v in value]
    if isinstance(value, bytes):  # YAML !!binary
        return value.decode("utf-8", errors="replace")
    return value


def _markdown_sections(body: str, preamble_path: tuple[str, ...], unclosed: list[str]) -> tuple[Section, ...]:
    if not body:
        return ()
    headings = list(_atx_headings(body, unclosed))
    sections: list[Section] = []
    stack: list[tuple[int, str]] = []  # stack: (level, title) of the enclosing headings
    if not headings or headings[0][0] > 0:
        sections.append(Section(preamble_path, 0, 0))
    for start, level, title in headings:
        sections.append(Section(push_heading(stack, level, title), start, start))
    return tiled(sections, len(body))


def _atx_headings(body: str, unclosed: list[str]) -> Iterator[tuple[int, int, str]]:
    """(offset, level, title) of each ATX heading outside fenced code blocks (a fence never closed: ``unclosed``)."""
    offset = 0
    for line, in_code in _fenced(body.split("\n"), unclosed):
        if not in_code and (heading := _atx_heading(line)) and heading[1]:
            yield offset, heading[0], heading[1]
        offset += len(line) + 1


def _fenced(lines: list[str], unclosed: list[str] | None = None) -> Iterator[tuple[str, bool]]:
    """Each line, and whether it is fenced code (the fences included); a fence never closed runs to the end, as
    in CommonMark, and its opening line is appended to ``unclosed``."""
    fence, opening = "", ""
    for line in lines:
        opener = _FENCE.match(line)
        if fence and opener and opener.group(1)[0] == fence[0] and len(opener.group(1)) >= len(fence):
            fence = ""
            yield line, True
        elif not fence and opener:
            fence, opening = opener.group(1), line
            yield line, True
        else:
            yield line, bool(fence)
    if fence and unclosed is not None:
        unclosed.append(opening)


def _mkdocs_markup(body: str) -> tuple[str, tuple[str, ...]]:
    """``body`` with MkDocs' markers as text and its snippets dropped; the snippets' notes (module docstring)."""
    if "!!!" not in body and "???" not in body and "===" not in body and "8<" not in body:
        return body, ()
    notes: list[str] = []
    source = _without_snippets(body.split("\n"), notes)
    lines = []
    for number, (line, in_code) in enumerate(_fenced(source)):
        text = line if in_code else _marker_as_text(line)
        if text is not line and not _has_body(source, number):
            kind = "content tab" if text.lstrip().startswith("Tab:") else "admonition"
            notes.append(f"{kind} {_quoted(line)} has nothing indented under it: what follows is not part of it")
        elif not in_code and '"' in line and _UNCLOSED_TITLE.fullmatch(line):
            notes.append(f"{_quoted(line)} is not a marker MkDocs reads (its title has no closing quote): kept as text")
        lines.append(text)
    return normalize_text("\n".join(lines)), tuple(notes)


def _has_body(lines: list[str], marker: int) -> bool:
    """Whether the first non-blank line after ``lines[marker]`` is indented deeper than it (its body).

    Linear over a page: each look runs over blank lines only, to the next line that is not blank."""
    indent = len(lines[marker]) - len(lines[marker].lstrip(" "))
    for following in range(marker + 1, len(lines)):
        line = lines[following]
        if line.strip():
            return len(line) - len(line.lstrip(" ")) > indent
    return False


def _quoted(line: str) -> str:
    """A line of the page as a note quotes it: stripped, at most ``QUOTED_CHARS`` characters."""
    line = line.strip()
    return repr(line if len(line) <= QUOTED_CHARS else line[: QUOTED_CHARS - 3] + "...")


def _marker_as_text(line: str) -> str:
    if (admonition := _ADMONITION.fullmatch(line)) is not None:
        indent, _, kind, title = admonition.groups()
        label = kind[:1].upper() + kind[1:]
        return f"{indent}{label}: {title.strip()}" if title and title.strip() else f"{indent}{label}:"
    if (tab := _TAB.fullmatch(line)) is not None:
        return f"{tab.group(1)}Tab: {tab.group(2).strip()}".rstrip()
    return line


def _without_snippets(lines: list[str], notes: list[str]) -> list[str]:
    """``lines`` without snippet lines and blocks (a block's unclosed last marker stays text); one note a file."""
    markers = [i for i, line in enumerate(lines) if "8<" in line and _bare_marker(line)]
    closing = dict(zip(markers[::2], markers[1::2]))  # opener -> closer; an odd last one opens nothing
    kept, skip_to = [], -1
    for i, line in enumerate(lines):
        if i <= skip_to:
            continue
        if i in closing:
            names = (name.strip() for name in lines[i + 1 : closing[i]])
            notes.extend(_snippet_note(name) for name in names if name and not name.startswith(";"))
            skip_to = closing[i]
        elif "8<" not in line:
            kept.append(line)
        elif (snippet := _SNIPPET.fullmatch(line)) is not None and not snippet.group(1):
            notes.append(_snippet_note(snippet.group(2)[1:-1]))
        else:
            kept.append(line.replace(";", "", 1) if (snippet or _SNIPPET_BLOCK.fullmatch(line)) else line)
    if len(markers) % 2:
        notes.append("snippet block (--8<--) is never closed: its marker and the lines after it are kept as text")
    return kept


def _bare_marker(line: str) -> bool:
    """A block snippet's opening or closing line (``--8<--`` alone), not escaped."""
    marker = _SNIPPET_BLOCK.fullmatch(line)
    return marker is not None and not marker.group(1)


def _snippet_note(name: str) -> str:
    return f"unresolved snippet {name!r} (--8<--): not indexed (strata reads no other file)"


def _atx_heading(line: str) -> tuple[int, str] | None:
    """(level, title) of an ATX heading line (``## Title ##``), else None.

    Scanned by hand, each step a linear ``str`` method: the regular expression
    ``^ {0,3}(#{1,6}) +(.*?)(?: +#+)? *$`` it replaces tried the closing
    sequence at every character of the title, rescanning each run of spaces
    (quadratic: 8k spaces in one heading took 0.45 s). Same results: the title
    is what lies between the opening marks and their spaces and the longest
    ending of the line that is spaces or spaces, marks and spaces.
    """
    indent = len(line) - len(line.lstrip(" "))
    rest = line[indent:]
    level = len(rest) - len(rest.lstrip("#"))
    if indent > 3 or not 1 <= level <= 6 or rest[level : level + 1] != " ":
        return None
    title = rest[level:].strip(" ")
    unclosed = title.rstrip("#")
    if unclosed != title and unclosed.endswith(" "):  # a closing sequence: spaces, then marks
        title = unclosed.rstrip(" ")
    return level, title.strip()
