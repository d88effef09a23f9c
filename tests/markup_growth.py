"""Every reStructuredText construct docutils builds a tree or a transform for, repeated to a size: the inputs of
the parse-growth matrix (tests/indexing/test_parse_growth.py, scripts/bench_hostile_rst.py).

docutils is a parser plus some twenty transforms, and a transform that walks the tree once per node (to its
siblings, its next node, its duplicates) is quadratic in the nodes of one kind: a 400 KB file of chained
``.. _tN:`` targets once cost 54 s of CPU. Each entry here is one kind of node, written many times the way a
hostile page would (one after another, all in one paragraph, all with one name), so that a transform which is
superlinear in that kind shows as a CPU time that more than doubles when the input doubles. The Markdown,
HTML and text worst cases of ``tests.pathological_text`` join the same matrix.
"""

from __future__ import annotations

from collections.abc import Callable

from tests.pathological_text import Pathology


def _units(unit: Callable[[int], str], prefix: str = "", suffix: str = "") -> Callable[[int], bytes]:
    """A builder of ``prefix``, then ``unit(0)``, ``unit(1)`` ... to about ``size`` bytes, then ``suffix``."""

    def build(size: int) -> bytes:
        parts, total, n = [prefix], len(prefix) + len(suffix), 0
        while total < size:
            parts.append(unit(n))
            total += len(parts[-1])
            n += 1
        return ("".join(parts) + suffix).encode("utf-8")

    return build


def _two_runs(first: Callable[[int], str], second: Callable[[int], str], between: str = "\n") -> Callable[[int], bytes]:
    """``first(n)`` units to about half of ``size``, then ``between``, then as many ``second(n)`` units
    (definitions before their uses, or the reverse)."""

    def build(size: int) -> bytes:
        heads: list[str] = []
        total = 0
        while total < size // 2:
            heads.append(first(len(heads)))
            total += len(heads[-1])
        return ("".join(heads) + between + "".join(second(n) for n in range(len(heads)))).encode("utf-8")

    return build


def _substitution_chain(n: int, length: int = 10) -> str:
    """``|sN_0|`` replaced by ``|sN_1|`` ... by ``x``: a substitution nested ``length`` deep, then its use."""
    links = "".join(f".. |s{n}_{k}| replace:: |s{n}_{k + 1}|\n" for k in range(length))
    return f"{links}.. |s{n}_{length}| replace:: x\n\n|s{n}_0|\n\n"


def _target_chain(n: int, length: int = 10) -> str:
    """``cN_0`` an indirect target to ``cN_1`` ... to a URI: a chain ``length`` long, then a reference."""
    links = "".join(f".. _c{n}_{k}: c{n}_{k + 1}_\n" for k in range(length))
    return f"{links}.. _c{n}_{length}: http://x/{n}\n\n`c{n}_0`_\n\n"


def _rst(name: str, build: Callable[[int], bytes], families: str) -> Pathology:
    return Pathology(name, ".rst", build, families)


RST_CONSTRUCTS: tuple[Pathology, ...] = (
    # hyperlink targets and references (docutils.transforms.references)
    _rst("chained_targets", _units(lambda n: f".. _t{n}:\n", suffix="\ntext\n"), "PropagateTargets (a chain)"),
    _rst(
        "chained_targets_then_references",
        _two_runs(lambda n: f".. _t{n}:\n", lambda n: f"`t{n}`_\n"),
        "PropagateTargets, InternalTargets",
    ),
    _rst(
        "targets_before_paragraphs",
        _units(lambda n: f".. _t{n}:\n\nA paragraph `t{n}`_ and t{n}_ here.\n\n"),
        "PropagateTargets, InternalTargets",
    ),
    _rst("references_in_one_paragraph", _units(lambda n: f"`t{n}`_\n", suffix="\n.. _t0:\n\nx\n"), "references"),
    _rst("one_target_many_references", _units(lambda n: "`same`_\n", ".. _same:\n\nx\n\n"), "references to one name"),
    _rst("duplicate_targets", _units(lambda n: ".. _same:\n\nx\n\n"), "duplicate names (dupnames)"),
    _rst(
        "external_targets", _two_runs(lambda n: f".. _t{n}: http://x/{n}\n", lambda n: f"`t{n}`_\n"), "ExternalTargets"
    ),
    _rst(
        "indirect_targets",
        _units(lambda n: f".. _a{n}: b{n}_\n.. _b{n}: http://x/{n}\n\n`a{n}`_\n\n"),
        "IndirectHyperlinks",
    ),
    _rst(
        "indirect_chain",
        _units(_target_chain),
        "IndirectHyperlinks (a chain)",
    ),
    _rst("embedded_uris", _units(lambda n: f"`x{n} <http://x/{n}>`_\n"), "embedded URIs (targets in text)"),
    _rst("same_name_embedded_uris", _units(lambda n: f"`same <http://x/{n}>`_\n"), "duplicate external targets"),
    _rst(
        "anonymous_targets",
        _two_runs(lambda n: f"`a{n}`__\n", lambda n: f"__ http://x/{n}\n"),
        "AnonymousHyperlinks",
    ),
    _rst("chained_anonymous_targets", _units(lambda n: ".. __:\n", suffix="\ntext\n"), "PropagateTargets (anonymous)"),
    _rst("dangling_references", _units(lambda n: f"d{n}_\n"), "references to no target"),
    # substitutions, footnotes, citations (references, misc)
    _rst(
        "substitutions",
        _two_runs(lambda n: f".. |s{n}| replace:: x{n}\n", lambda n: f"|s{n}|\n"),
        "Substitutions",
    ),
    _rst(
        "nested_substitutions",
        _units(_substitution_chain),
        "Substitutions (a chain)",
    ),
    _rst("numbered_footnotes", _two_runs(lambda n: f"[{n + 1}]_\n", lambda n: f".. [{n + 1}] f\n"), "Footnotes"),
    _rst("auto_footnotes", _two_runs(lambda n: "[#]_\n", lambda n: ".. [#] f\n"), "Footnotes (auto-numbered)"),
    _rst(
        "labelled_auto_footnotes",
        _two_runs(lambda n: f"[#f{n}]_\n", lambda n: f".. [#f{n}] f\n"),
        "Footnotes (auto-labelled)",
    ),
    _rst("symbol_footnotes", _two_runs(lambda n: "[*]_\n", lambda n: ".. [*] f\n"), "Footnotes (symbols)"),
    _rst("citations", _two_runs(lambda n: f"[C{n}]_\n", lambda n: f".. [C{n}] c\n"), "citations"),
    # sections and ids (parser, misc, universal)
    _rst("sections", _units(lambda n: f"Title {n}\n=========\n\nx\n\n"), "sections, implicit targets"),
    _rst("same_title_sections", _units(lambda n: "Same\n====\n\nx\n\n"), "duplicate implicit targets (ids)"),
    _rst("nested_sections", _units(lambda n: f"T{n}\n{'=-~^'[n % 4] * 8}\n\nx\n\n"), "section nesting"),
    # body elements
    _rst("bullet_list", _units(lambda n: f"- item {n}\n"), "lists"),
    _rst("nested_lists", _units(lambda n: "  " * (n % 40) + "- item\n\n"), "nested lists"),
    _rst("enumerated_list", _units(lambda n: f"{n + 1}. item\n"), "enumerated lists"),
    _rst("definition_list", _units(lambda n: f"term {n}\n  definition\n"), "definition lists"),
    _rst("field_list", _units(lambda n: f":f{n}: value\n", "x\n\n"), "field lists"),
    _rst("option_list", _units(lambda n: f"-o{n}  option\n"), "option lists"),
    _rst("line_block", _units(lambda n: "| a line\n"), "line blocks"),
    _rst("simple_table", _units(lambda n: "a  b\n", "=  =\na  b\n=  =\n", "=  =\n"), "simple tables"),
    _rst("grid_table", _units(lambda n: "| a | b |\n+---+---+\n", "+---+---+\n"), "grid tables"),
    _rst("admonitions", _units(lambda n: ".. note:: x\n\n"), "directives"),
    _rst("comments", _units(lambda n: f".. comment {n}\n"), "comments"),
    _rst("literal_blocks", _units(lambda n: "::\n\n  code\n\n"), "literal blocks"),
    # inline markup and roles
    _rst("inline_markup", _units(lambda n: "*e* **s** ``l``\n"), "inline markup"),
    _rst("known_roles", _units(lambda n: ":emphasis:`x` :sub:`y`\n"), "interpreted text roles"),
    _rst("unknown_roles", _units(lambda n: f":ref:`x{n}`\n"), "roles docutils does not know"),
    _rst("default_role", _units(lambda n: "`x`\n"), "the default role"),
)
