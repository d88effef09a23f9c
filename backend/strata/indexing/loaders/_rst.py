"""reStructuredText loader: docutils' document tree as text, split into sections as Markdown is.

docutils parses the file; its section nesting gives the heading levels (any
adornment style it accepts: the first style met is level 1, as ``#`` is in
Markdown), so a section's heading path is the titles of it and its enclosing
sections, and text before the first title is a preamble under ``()`` (or the
``:title:`` field). A field list opening the file (docutils' bibliographic
fields: ``:title:``, ``:author:``, ``:module:`` ...) is the metadata, read as
Markdown's front matter is, and not text.

What the tree holds becomes plain text: paragraphs, literal and code blocks
verbatim, list items as ``- item``, table rows as ``cell | cell``,
admonitions as ``Note: ...``. Sphinx-only markup does not fail the file nor
put docutils' error messages in the text: an unknown role keeps its text
(``:ref:`Title <label>``` is ``Title``), an unknown directive keeps its
argument and content (``versionadded`` and the like with a readable label),
navigation directives (``toctree``, ``index``, ``contents`` ...) are dropped,
and a directive option docutils does not know is ignored. Markup docutils
refuses (a system message of level ERROR or SEVERE: a malformed table, a title
that skips a level, a directive missing its argument) is a note naming the
line and docutils' message; the refused table's text (without its borders) and
title's text are kept, other refused markup is not indexed, and warnings (an
unclosed ``*``, a short underline) are not notes: their text is kept. Nothing reads
another file: ``include``, ``literalinclude`` and ``raw``/``csv-table`` with
``:file:``/``:url:`` are reported as unresolved notes, not indexed, and
docutils' own file insertion and raw output are off.

docutils is not linear everywhere: its inline parser rescans the rest of a
paragraph from each markup start it meets (a 40 KB paragraph of ``*a `` took
6 s, twice the 20 KB one's four times). So inline text is parsed in pieces of
at most ``INLINE_PIECE_CHARS``, cut at a line break or space (markup spanning a
cut is kept as plain text), which bounds that cost by the piece, not the
paragraph. Two of its transforms are quadratic: the one reporting dangling
references is left out, and ``PropagateTargets`` is replaced by a linear
equivalent (``_rst_targets``); every construct's growth is checked by
tests/indexing/test_parse_growth.py. A line over docutils' line-length limit fails the file with that
reason, rather than docutils replacing the whole document by its error. The
parse is bounded like every format's: lines counted against ``max_elements``
before docutils runs, then the child process's time and memory
(``_isolated``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from docutils import nodes, utils
from docutils.core import publish_doctree
from docutils.parsers.rst import Directive, Parser, directives, roles, states
from docutils.readers import standalone
from docutils.transforms import references

from strata.errors import LoaderError
from strata.indexing.loaders._limits import LoaderLimits
from strata.indexing.loaders._markdown import normalized_metadata
from strata.indexing.loaders._rst_targets import LinearPropagateTargets
from strata.indexing.loaders._text import LINE_BREAKS, Parsed, assemble, decode_text, heading_parts

INLINE_PIECE_CHARS = 1024
LINE_LENGTH_LIMIT = 10_000  # docutils' default: a longer line fails the file
ERROR_LEVEL = 3  # docutils' system messages from ERROR up (SEVERE) are notes; INFO and WARNING are not
MESSAGE_CHARS = 200  # a docutils message quoted in a note, at most

_SETTINGS = {
    "report_level": 5,  # no system message is reported ...
    "halt_level": 5,  # ... nor raised: they stay in the tree, where rendering skips them
    "warning_stream": False,
    "file_insertion_enabled": False,
    "raw_enabled": False,
    "doctitle_xform": False,  # the first title stays a level-1 section, as "# Title" does in Markdown
    "sectsubtitle_xform": False,
    "line_length_limit": LINE_LENGTH_LIMIT,
    "smart_quotes": False,
    "_disable_config": True,  # no docutils.conf read from the working folder or home
    "traceback": True,  # an unexpected error raises (reported as a parser error) instead of exiting
}

# Directives whose text is navigation or output settings, not content.
_DROPPED = frozenset(
    {
        "toctree",
        "index",
        "highlight",
        "currentmodule",
        "module",
        "contents",
        "sectnum",
        "section-numbering",
        "header",
        "footer",
        "meta",
        "title",
        "target-notes",
        "tabularcolumns",
        "autosummary",
    }
)
_INCLUDES = frozenset({"include", "literalinclude"})
_FILE_OPTIONS = ("file", "url")  # raw and csv-table read these
# Sphinx's labelled paragraphs: "versionadded:: 2.0" reads "New in version 2.0: ..."
_LABELS = {
    "versionadded": "New in version",
    "versionchanged": "Changed in version",
    "deprecated": "Deprecated since version",
    "versionremoved": "Removed in version",
    "seealso": "See also",
    "todo": "To do",
}


def parse_rst(raw: bytes, limits: LoaderLimits = LoaderLimits()) -> Parsed:
    """reStructuredText: one section per title, by docutils' nesting; the opening field list as metadata."""
    text = LINE_BREAKS.sub("\n", decode_text(raw))
    limits.check_elements("reStructuredText lines", text.count("\n") + 1)
    _check_line_lengths(text)
    unresolved: list[str] = []
    try:
        with _permissive_markup(unresolved):
            parser = Parser(inliner=_piecewise_inliner())
            document = publish_doctree(text, reader=_Reader(), parser=parser, settings_overrides=_SETTINGS)
        metadata = _docinfo(document)
        title = metadata.get("title")
        lines: list[tuple[int | None, str]] = []
        _Renderer(lines).children(document, 0)
    except RecursionError:
        raise LoaderError("reStructuredText nested too deeply") from None
    text, sections = assemble(heading_parts(lines, (str(title).strip(),) if title not in (None, "") else ()))
    limits.check_elements("reStructuredText sections", len(sections))
    notes = [f"unresolved {what}: not indexed (strata reads no other file)" for what in unresolved]
    notes.extend(_error_note(m) for m in document.findall(nodes.system_message) if m["level"] >= ERROR_LEVEL)
    return Parsed(text, sections, metadata, tuple(notes))


def _check_line_lengths(text: str) -> None:
    """docutils would replace the whole document by its error: the file fails with the reason instead."""
    for number, line in enumerate(text.split("\n"), start=1):
        if len(line) > LINE_LENGTH_LIMIT:
            raise LoaderError(
                f"line {number} is {len(line):,} characters, over docutils' line-length limit ({LINE_LENGTH_LIMIT:,})"
            )


def _piecewise_inliner() -> states.Inliner:
    """docutils' inline parser, run on pieces of at most ``INLINE_PIECE_CHARS`` (see the module docstring).

    Its instance's ``parse`` is wrapped, not the class subclassed: ``Inliner`` builds its patterns from the
    attributes of its own class only.
    """
    inliner = states.Inliner()
    parse_whole = inliner.parse

    def parse(text: str, lineno: int, memo: Any, parent: Any) -> tuple[list[Any], list[Any]]:
        if len(text) <= INLINE_PIECE_CHARS:
            return parse_whole(text, lineno, memo, parent)
        found: tuple[list[Any], list[Any]] = ([], [])
        for piece in _pieces(text, INLINE_PIECE_CHARS):
            parsed, messages = parse_whole(piece, lineno, memo, parent)
            found[0].append(nodes.inline("", "", *parsed))  # a node a piece: see _Reader
            found[1].extend(messages)
        return found

    inliner.parse = parse
    return inliner


class _Reader(standalone.Reader):
    """docutils' reader without the transform that reports dangling references, and with a linear
    ``PropagateTargets`` (``_rst_targets``).

    ``DanglingReferences`` replaces each reference to an unknown target in its paragraph by position
    (``list.index`` over the paragraph's children), so a paragraph of N such references took N² steps (256 KB
    of ``a_`` did not end in 300 s); strata wants their text, which stays. Substitutions are replaced the
    same way, which the inline pieces bound: a long paragraph's children are its pieces, each holding what it
    parsed to. ``PropagateTargets`` looked each ``.. _name:`` up among its siblings and handed a run of
    targets' ids on one target at a time (a 400 KB page of targets: 54 s of CPU).
    """

    def get_transforms(self) -> list[Any]:
        replaced = {references.PropagateTargets: LinearPropagateTargets}
        transforms = super().get_transforms()
        return [replaced.get(t, t) for t in transforms if t is not references.DanglingReferences]


def _pieces(text: str, size: int) -> Iterator[str]:
    """``text`` in consecutive pieces of at most ``size`` characters, each ending at its last line break or
    space when it has one (the break stays with the piece, so the pieces join to ``text``)."""
    start = 0
    while len(text) - start > size:
        end = start + size
        cut = text.rfind("\n", start, end)
        if cut < start + size // 2:
            cut = max(cut, text.rfind(" ", start, end))
        end = cut + 1 if cut >= start else end
        yield text[start:end]
        start = end
    yield text[start:]


# --- Sphinx and other markup docutils does not know -----------------------------------------------------------


class _AnyOption(dict[str, Any]):
    """An option spec that takes any option (Sphinx's ``:linenos:``, ``:caption:`` ...) as text."""

    def __missing__(self, name: str) -> Callable[[str | None], str | None]:
        return directives.unchanged

    def __bool__(self) -> bool:
        return True  # docutils parses options only when the spec is truthy


def _permissive(cls: type[Directive]) -> type[Directive]:
    return type(cls.__name__, (cls,), {"option_spec": _AnyOption(cls.option_spec or {})})


class _Generic(Directive):
    """A directive docutils does not know: its argument, then its content parsed as reStructuredText."""

    optional_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = _AnyOption()

    def run(self) -> list[nodes.Node]:
        label = _LABELS.get(self.name.lower())
        argument = self.arguments[0] if self.arguments else ""
        node: nodes.Element = nodes.admonition() if label else nodes.container()
        if label:  # rendered "New in version 2.0: ...", as an admonition is
            version = ""
            if label.endswith(" version"):  # the first word is the version, the rest its explanation
                version, argument = [*argument.split(None, 1), "", ""][:2]
            node += nodes.title(text=f"{label} {version}".strip())
        if argument.strip():
            node += nodes.paragraph(text=argument)
        if self.content:
            self.state.nested_parse(self.content, self.content_offset, node)
        return [node]


class _Dropped(Directive):
    optional_arguments = 1
    final_argument_whitespace = True
    has_content = True
    option_spec = _AnyOption()

    def run(self) -> list[nodes.Node]:
        return []


def _unresolved_directive(unresolved: list[str], inner: type[Directive] | None) -> type[Directive]:
    """A directive that records what file it would read (``inner`` runs when it reads none)."""

    class Unresolved(inner or _Dropped):  # type: ignore[misc]
        option_spec = _AnyOption((inner.option_spec or {}) if inner else {})

        def run(self) -> list[nodes.Node]:
            name = self.name.lower()
            if name in _INCLUDES:
                target = self.arguments[0] if self.arguments else ""
            elif any(option in self.options for option in _FILE_OPTIONS):
                target = next(str(self.options[o]) for o in _FILE_OPTIONS if o in self.options)
            else:
                return super().run() if inner is not None else []
            unresolved.append(f"{name} {target!r} (line {self.lineno})")
            return []

    return Unresolved


@contextlib.contextmanager
def _permissive_markup(unresolved: list[str]) -> Iterator[None]:
    """docutils' directive and role lookups, made permissive for one parse (see the module docstring).

    The lookups are module functions of docutils: replaced while the parse runs (in the parse's child
    process, so no other parse sees them) and restored after.
    """
    find_directive, find_role = directives.directive, roles.role

    def directive(name: str, language: Any, document: Any) -> tuple[type[Directive], list[Any]]:
        key = name.lower()
        if key in _DROPPED:
            return _Dropped, []
        if key in _INCLUDES:
            return _unresolved_directive(unresolved, None), []
        found, _ = find_directive(name, language, document)
        if key in ("raw", "csv-table"):
            return _unresolved_directive(unresolved, None if key == "raw" else found), []
        return (_permissive(found) if found is not None else _Generic), []

    def role(name: str, language: Any, lineno: int, reporter: Any) -> tuple[Callable[..., Any], list[Any]]:
        found, _ = find_role(name, language, lineno, reporter)
        return (found if found is not None and name.lower() != "raw" else _text_role), []

    directives.directive, roles.role = directive, role
    try:
        yield
    finally:
        directives.directive, roles.role = find_directive, find_role


def _text_role(
    name: str, rawtext: str, text: str, lineno: int, inliner: Any, options: Any = None, content: Any = None
) -> tuple[list[nodes.Node], list[Any]]:
    """A role docutils does not know (``:ref:``, ``:py:func:``): the text it shows."""
    shown = utils.unescape(text).strip()
    if shown.endswith(">") and "<" in shown:  # "Title <target>"
        title = shown[: shown.rfind("<")].strip()
        shown = title or shown[shown.rfind("<") + 1 : -1]
    return [nodes.inline(rawtext, shown.lstrip("~!"))], []


# --- the tree as lines ------------------------------------------------------------------------------------------

_SKIPPED = (
    nodes.system_message,
    nodes.comment,
    nodes.target,
    nodes.substitution_definition,
    nodes.raw,
    nodes.pending,
    nodes.decoration,
    nodes.docinfo,
    nodes.transition,
    nodes.colspec,
    nodes.meta,
)
_VERBATIM = (nodes.literal_block, nodes.doctest_block, nodes.math_block)
_ADMONITIONS = (nodes.Admonition,)


class _Renderer:
    """Appends (heading level or None, line) pairs for ``heading_parts``; blocks are separated by ``""``."""

    def __init__(self, out: list[tuple[int | None, str]]) -> None:
        self.out = out

    def children(self, node: nodes.Element, depth: int) -> None:
        for child in node.children:
            self.node(child, depth)

    def node(self, node: nodes.Node, depth: int) -> None:
        if isinstance(node, nodes.system_message):
            self.block(_kept_of_refused(node))
            return
        if isinstance(node, _SKIPPED):
            return
        if isinstance(node, nodes.section):
            title = next((c for c in node.children if isinstance(c, nodes.title)), None)
            if title is not None and title.astext().strip():
                self.out.extend([(depth + 1, " ".join(title.astext().split())), (None, "")])
            for child in node.children:
                if child is not title:
                    self.node(child, depth + 1)
            return
        self.block("\n".join(_block_lines(node)))

    def block(self, text: str) -> None:
        if text.strip():
            self.out.extend((None, line) for line in (*text.split("\n"), ""))


# docutils errors whose markup strata keeps as text: a title docutils refused, and a malformed table.
_TITLE_ERRORS = (
    "Inconsistent title style",
    "Title level inconsistent",
    "Title overline",
    "Missing matching underline",
    "Incomplete section title",
)
_TABLE_ERRORS = ("Malformed table",)
_TABLE_BORDER = frozenset("+-=|: ")


def _message(message: nodes.system_message) -> str:
    """What docutils says in ``message``, on one line."""
    return " ".join(message.children[0].astext().split()) if message.children else ""


def _refused_markup(message: nodes.system_message) -> str:
    """The markup ``message`` quotes (docutils puts the lines it refused in a literal block), or ``""``."""
    return next((c.astext() for c in message.children if isinstance(c, nodes.literal_block)), "")


def _kept_of_refused(message: nodes.system_message) -> str:
    """The text strata keeps of markup docutils refused: a title as text (one line), a malformed table's lines
    without its borders; else ``""`` (other messages, and the lines they quote, are not text; a warning's
    markup, such as a title whose overline is short, was read as docutils reads it)."""
    if message["level"] < ERROR_LEVEL:
        return ""
    said = _message(message)
    lines = [line.strip() for line in _refused_markup(message).split("\n") if line.strip()]
    if said.startswith(_TITLE_ERRORS):
        return " ".join(line for line in lines if not _adornment(line))
    if said.startswith(_TABLE_ERRORS):
        return "\n".join(line for line in lines if not set(line) <= _TABLE_BORDER)
    return ""


def _error_note(message: nodes.system_message) -> str:
    """A note of one docutils error: its line, what docutils said, and what strata indexed of the markup."""
    said = _message(message)
    if len(said) > MESSAGE_CHARS:
        said = said[: MESSAGE_CHARS - 3] + "..."
    where = f" at line {message['line']}" if message.get("line") else ""
    if said.startswith(_TITLE_ERRORS):
        kept = " (the title is indexed as text, not as a heading)"
    elif said.startswith(_TABLE_ERRORS):
        kept = " (the table's lines are indexed as text, without its borders)"
    elif _refused_markup(message):
        kept = " (that markup is not indexed)"
    else:
        kept = ""
    return f"docutils error{where}: {said}{kept}"


def _adornment(line: str) -> bool:
    return len(set(line)) == 1 and not line[0].isalnum()


def _block_lines(node: nodes.Node) -> list[str]:
    """The lines of one block-level node (a paragraph, list, table, admonition ...), nested ones indented."""
    if isinstance(node, nodes.system_message):
        kept = _kept_of_refused(node)
        return kept.split("\n") if kept else []
    if isinstance(node, _SKIPPED):
        return []
    if isinstance(node, nodes.Text):
        return str(node).split("\n")
    if isinstance(node, _VERBATIM):
        return node.astext().split("\n")
    if isinstance(node, nodes.TextElement):  # paragraph, title, rubric, term, line ...: inline content
        return node.astext().split("\n")
    if isinstance(node, (nodes.bullet_list, nodes.enumerated_list)):
        return _list_lines(node)
    if isinstance(node, nodes.table):
        return _table_lines(node)
    if isinstance(node, _ADMONITIONS):
        return _admonition_lines(node)
    if isinstance(node, (nodes.footnote, nodes.citation)):
        label = next((c.astext() for c in node.children if isinstance(c, nodes.label)), "")
        body = _joined(c for c in node.children if not isinstance(c, nodes.label))
        return _prefixed(f"[{label}] " if label else "", body)
    if isinstance(node, nodes.image):
        return [node.get("alt", "")] if node.get("alt") else []
    if isinstance(node, nodes.definition_list_item):
        term = [" : ".join(c.astext() for c in node.children if isinstance(c, (nodes.term, nodes.classifier)))]
        definition = [c for c in node.children if isinstance(c, nodes.definition)]
        return term + ["  " + line if line else line for line in _joined(definition)]
    if isinstance(node, (nodes.field, nodes.option_list_item)):
        head, *rest = node.children
        return _labelled(head.astext(), rest)
    if isinstance(node, (nodes.line_block, nodes.definition_list, nodes.field_list, nodes.option_list)):
        return [line for child in node.children for line in _block_lines(child)]
    if isinstance(node, nodes.Element):  # block quotes, containers, topics, figures, unknown directives ...
        return _joined(node.children)
    return []


def _joined(children: Any) -> list[str]:
    """The children's lines, a blank line between blocks."""
    lines: list[str] = []
    for child in children:
        block = _block_lines(child)
        if block and any(line.strip() for line in block):
            lines.extend(["", *block] if lines else block)
    return lines


def _labelled(label: str, children: Any) -> list[str]:
    """``Label: text`` when the body opens with a paragraph, else ``Label:`` over the body, indented."""
    children = list(children)
    body = _joined(children)
    if children and isinstance(_first_block(children[0]), nodes.paragraph):
        return _prefixed(f"{label}: ", body)
    return [f"{label}:", *("  " + line if line else line for line in body)]


def _first_block(node: nodes.Node) -> nodes.Node:
    while isinstance(node, (nodes.field_body, nodes.description, nodes.container)) and node.children:
        node = node.children[0]
    return node


def _prefixed(prefix: str, lines: list[str]) -> list[str]:
    if not lines:
        return [prefix.strip()] if prefix.strip() else []
    return [prefix + lines[0], *("  " + line if line else line for line in lines[1:])]


def _list_lines(node: nodes.Element) -> list[str]:
    lines = []
    for number, item in enumerate(node.children, start=int(node.get("start", 1))):
        marker = f"{number}. " if isinstance(node, nodes.enumerated_list) else "- "
        lines.extend(_prefixed(marker, [line for line in _joined(item.children) if line.strip()]))
    return lines


def _table_lines(node: nodes.Element) -> list[str]:
    lines = [c.astext() for c in node.children if isinstance(c, nodes.title)]
    groups = [part for group in node.children if isinstance(group, nodes.tgroup) for part in group.children]
    rows = [row for part in groups if isinstance(part, (nodes.thead, nodes.tbody)) for row in part.children]
    for row in rows:
        cells = [" ".join(" ".join(_joined(entry.children)).split()) for entry in row.children]
        if any(cells):
            lines.append(" | ".join(cells))
    return lines


def _admonition_lines(node: nodes.Element) -> list[str]:
    title = next((c for c in node.children if isinstance(c, nodes.title)), None)
    label = " ".join(title.astext().split()) if title is not None else node.tagname.replace("_", " ").capitalize()
    return _labelled(label, [c for c in node.children if c is not title])


def _docinfo(document: nodes.document) -> dict[str, Any]:
    """The opening field list (docutils' docinfo) as metadata, normalized as Markdown's front matter."""
    fields: dict[str, Any] = {}
    for info in document.findall(nodes.docinfo):
        for child in info.children:
            if isinstance(child, nodes.field):
                name, body = child.children[0].astext(), child.children[1].astext()
            else:  # a registered field: <author>, <version> ...
                name, body = child.tagname, child.astext()
            fields[name.strip().lower().replace(" ", "_")] = " ".join(body.split())
    for key in ("skill_points", "score_points"):
        if isinstance(fields.get(key), str):
            fields[key] = [part for part in (p.strip() for p in fields[key].split(",")) if part]
    return normalized_metadata(fields) if fields else {}
