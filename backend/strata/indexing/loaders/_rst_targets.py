"""docutils' ``PropagateTargets`` in time linear in the document, for the reStructuredText loader.

``.. _name:`` on a line of its own names the element that follows it: docutils' transform moves the
target's ids and names to the next element. It is quadratic twice over:

- it finds "the next element" with ``next_node(ascend=True)``, which looks the target up among its
  siblings with ``list.index``: a page of N top-level targets costs N²/2 comparisons (10,000 targets
  each followed by a paragraph: 31 s of CPU for 160 KB);
- a target followed by another target hands its ids to that target, which hands them on with its own,
  so a run of N targets moves N²/2 ids ("``.. _t1:``" ... "``.. _t4000:``" on consecutive lines: 5 s).

This transform gives the same tree: it walks the document once (its order and each node's position
are computed up front, so the next node of a target is a list lookup), and a run of targets that
hand their ids on is moved once, from the first target to the element that finally takes them, in the
order docutils would have left them. Everything else (which targets move, the ``refid`` each keeps,
the figure caption case, ``expect_referenced_by_*``) is docutils' own rule, unchanged.
"""

from __future__ import annotations

from typing import Any

from docutils import nodes
from docutils.transforms import references


class LinearPropagateTargets(references.PropagateTargets):
    """``PropagateTargets`` with the same result in one pass (see the module docstring)."""

    def apply(self, **kwargs: Any) -> None:
        order = list(self.document.findall())
        position = {id(node): n for n, node in enumerate(order)}
        carried: dict[int, list[nodes.target]] = {}  # a target -> the run of targets that hand it their ids
        for target in order:
            if not (isinstance(target, nodes.target) and _moves(target)):
                continue
            run = carried.pop(id(target), [])
            run.append(target)
            next_node = _next_node(order, position, target)
            if isinstance(next_node, nodes.target) and _moves(next_node):
                carried[id(next_node)] = run  # docutils moves the ids on with the next target's own
                continue
            if next_node is None or (
                isinstance(next_node, (nodes.Invisible, nodes.Targetable)) and not isinstance(next_node, nodes.target)
            ):
                if len(run) > 1:  # the last of the run keeps what the others handed it
                    self._move(run[:-1], run[-1])
                continue
            in_figure = isinstance(target.parent, nodes.figure) and isinstance(next_node, nodes.caption)
            self._move(run, next_node, last_removed=in_figure)
            if in_figure:  # docutils removes a figure's target once its caption holds its ids
                target.parent.remove(target)

    def _move(self, run: list[nodes.target], receiver: nodes.Element, *, last_removed: bool = False) -> None:
        """The ids and names of ``run`` (targets in document order, each handing its own on to the next) added
        to ``receiver``'s as docutils' one-at-a-time moves leave them, and each target of the run left
        pointing to its first former id (all but the last with ``last_removed``)."""
        owned = [(target, list(target["ids"]), list(target["names"])) for target in run]
        by_id: dict[str, nodes.Element] = {}
        by_name: dict[str, nodes.Element] = {}
        for target, ids, names in owned:
            by_id.update((ident, target) for ident in ids)
            by_name.update((name, target) for name in names)
            by_id.update(getattr(target, "expect_referenced_by_id", {}))
            by_name.update(getattr(target, "expect_referenced_by_name", {}))
        for _, ids, names in reversed(owned):  # the last target's own first, as docutils accumulates them
            receiver["ids"].extend(ids)
            receiver["names"].extend(names)
            self.document.ids.update((ident, receiver) for ident in ids)
        if not hasattr(receiver, "expect_referenced_by_name"):
            receiver.expect_referenced_by_name = {}
        if not hasattr(receiver, "expect_referenced_by_id"):
            receiver.expect_referenced_by_id = {}
        receiver.expect_referenced_by_id.update(by_id)
        receiver.expect_referenced_by_name.update(by_name)
        for target, ids, _ in owned[:-1] if last_removed else owned:
            if ids:
                target["refid"] = ids[0]
            target["ids"] = []
            target["names"] = []
            self.document.note_refid(target)


def _moves(target: nodes.target) -> bool:
    """Whether docutils moves this target's ids: a block-level target that refers to nothing."""
    return not (
        isinstance(target.parent, nodes.TextElement)
        or target.hasattr("refid")
        or target.hasattr("refuri")
        or target.hasattr("refname")
    )


def _next_node(order: list[nodes.Node], position: dict[int, int], target: nodes.target) -> nodes.Node | None:
    """``target.next_node(ascend=True)`` skipping system messages, as docutils' transform asks, from the
    document order: a target has no children, so its next node is the next in that order."""
    at = position[id(target)] + 1
    while at < len(order) and isinstance(order[at], nodes.system_message):
        at = _after(order, position, order[at])
    return order[at] if at < len(order) else None


def _after(order: list[nodes.Node], position: dict[int, int], node: nodes.Node) -> int:
    """The position of the first node after ``node`` and its descendants."""
    last = node
    while isinstance(last, nodes.Element) and last.children:
        last = last.children[-1]
    return position[id(last)] + 1
