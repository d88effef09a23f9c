"""The linear ``PropagateTargets`` leaves the tree docutils' own transform leaves: the same ids, names, refids,
id map and referenced-by maps, on every arrangement of targets a page can make (runs of targets, targets
before a section, a figure's caption, system messages between, targets at the end, inline targets).

One difference is by design: docutils leaves each target a run passes through holding referenced-by maps of
the targets before it (N²/2 entries for a run of N); nothing reads them, since ``document.ids`` points past
those targets to the element that took their ids, so they are compared on every other node."""

from __future__ import annotations

from typing import Any

import pytest
from docutils import nodes
from docutils.core import publish_doctree
from docutils.readers import standalone
from docutils.transforms import references

from strata.indexing.loaders._rst import _SETTINGS
from strata.indexing.loaders._rst_targets import LinearPropagateTargets

pytestmark = pytest.mark.unit

PAGES = {
    "one_target": ".. _a:\n\nA paragraph.\n",
    "a_run_of_targets": ".. _a:\n.. _b:\n.. __:\n.. _c:\n\nA paragraph `a`_ `b`_ `c`_.\n",
    "a_run_at_the_end": "Text.\n\n.. _a:\n.. _b:\n.. _c:\n",
    "a_run_before_a_comment": ".. _a:\n.. _b:\n\n.. a comment\n\nText.\n",
    "a_run_before_an_external_target": ".. _a:\n.. _b:\n.. _c: http://x\n\n`a`_ `c`_\n",
    "a_run_before_a_footnote": ".. _a:\n.. _b:\n\n.. [1] a note\n\nText [1]_.\n",
    "targets_before_sections": ".. _a:\n\nTitle\n=====\n\n.. _b:\n.. _c:\n\nSub\n---\n\n`b`_ and `a`_\n",
    "duplicate_names": ".. _same:\n\nx\n\n.. _same:\n\ny\n\n`same`_\n",
    "a_system_message_between": ".. _a:\n\n.. unknown-directive-xyz::\n\nText `a`_.\n",
    "a_figure_caption": ".. figure:: pic.png\n\n   .. _cap:\n\n   The caption.\n\nSee `cap`_.\n",
    "nested": "- item\n\n  .. _a:\n  .. _b:\n\n  inner `a`_\n\n.. _c:\n\nafter `c`_\n",
    "inline_targets": "An _`inline` target and `inline`_.\n\n.. _block:\n\nText.\n",
    "last_target_in_a_list": "- one\n\n  .. _a:\n\n- two `a`_\n",
}


class _Original(standalone.Reader):
    def get_transforms(self) -> list[Any]:
        return [t for t in super().get_transforms() if t is not references.DanglingReferences]


class _Linear(standalone.Reader):
    def get_transforms(self) -> list[Any]:
        swap = {references.PropagateTargets: LinearPropagateTargets}
        return [swap.get(t, t) for t in super().get_transforms() if t is not references.DanglingReferences]


def _tree(text: str, reader: standalone.Reader) -> tuple[str, dict[str, str], list[tuple[str, list[str], list[str]]]]:
    document = publish_doctree(text, reader=reader, settings_overrides=_SETTINGS)
    ids = {ident: node.tagname + repr(node.get("ids")) for ident, node in document.ids.items()}
    expected = [
        (
            node.tagname,
            sorted(getattr(node, "expect_referenced_by_id", {})),
            sorted(getattr(node, "expect_referenced_by_name", {})),
        )
        for node in document.findall(nodes.Element)
        if not (isinstance(node, nodes.target) and node.get("refid"))  # moved on: see the module docstring
    ]
    return document.pformat(), ids, expected


@pytest.mark.parametrize("name", PAGES)
def test_the_tree_is_the_one_docutils_leaves(name: str) -> None:
    assert _tree(PAGES[name], _Linear()) == _tree(PAGES[name], _Original())


def test_a_run_of_targets_names_the_paragraph_after_it() -> None:
    document = publish_doctree(PAGES["a_run_of_targets"], reader=_Linear(), settings_overrides=_SETTINGS)
    paragraph = next(document.findall(nodes.paragraph))
    assert paragraph["names"] == ["c", "b", "a"]
    assert all(target.get("refid") for target in document.findall(nodes.target) if not target.get("refuri"))
