"""scripts/import_cycles.py (run by scripts/check) finds every circle of imports, and strata has none."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import grimp
import pytest

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "import_cycles.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graph_of(imports: list[tuple[str, str]]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported)
    return graph


def test_every_circle_is_found_with_a_path_around_it() -> None:
    script = load_script()
    graph = graph_of([("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.e", "p.f"), ("p.f", "p.e")])
    assert sorted(script.circles(graph)) == [["p.a", "p.b", "p.c"], ["p.e", "p.f"]]
    assert script.path_around(graph, ["p.a", "p.b", "p.c"]) == ["p.a", "p.b", "p.c", "p.a"]
    assert script.circles(graph_of([("p.a", "p.b"), ("p.b", "p.c")])) == []


def test_strata_has_no_circle(capsys: pytest.CaptureFixture[str]) -> None:
    assert load_script().main() == 0, capsys.readouterr().out
