"""Fails when strata's modules import each other in a circle (scripts/check runs it).

grimp (the import graph import-linter is built on) reads every import of the package, those under
``if TYPE_CHECKING:`` left out: they never run. A circle is a strongly connected set of modules, each one
reaching every other through imports; each is printed with one import path around it. A package's
``__init__`` importing its own submodules is not a circle unless a submodule imports the package back.

    python scripts/import_cycles.py            # exit 1 and the circles, or 0
"""

from __future__ import annotations

import sys

import grimp

PACKAGE = "strata"

ALLOWED: dict[frozenset[str], str] = {}
"""Circles tolerated for now (their modules, and why); an allowed circle that is gone is reported, so that its
entry goes too. None is."""


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan's algorithm, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == module:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def path_around(graph: grimp.ImportGraph, members: list[str]) -> list[str]:
    """One import path from the first member back to itself, through the others."""
    first = members[0]
    back = next(m for m in sorted(graph.find_modules_that_directly_import(first)) if m in members)
    chain = graph.find_shortest_chain(importer=first, imported=back) or (first, back)
    return [*chain, first]


def main() -> int:
    graph = grimp.build_graph(PACKAGE, exclude_type_checking_imports=True, cache_dir=None)
    found = circles(graph)
    failed = False
    for members in found:
        why = ALLOWED.get(frozenset(members))
        label = f"allowed for now ({why})" if why else "import cycle"
        print(f"{label}: {' -> '.join(path_around(graph, members))}")
        failed = failed or why is None
    for gone in set(ALLOWED) - {frozenset(m) for m in found}:
        print(f"an allowed import cycle is gone, remove it from ALLOWED: {sorted(gone)}")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
