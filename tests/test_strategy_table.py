"""The strategy table is the one list of strategies: the source names them nowhere else, and every
list a user sees (settings, API, CLI, console, registry, eval) equals it."""

from __future__ import annotations

import io
import re
import tokenize
from collections import defaultdict
from pathlib import Path
from typing import get_args

import pytest
from fastapi.testclient import TestClient

from strata.api import create_app
from strata.cli import build_parser
from strata.config import RetrievalSettings, Settings
from strata.evaluation.modes import MODES, SPEC_ROWS
from strata.rag import STRATEGIES as RAG_STRATEGIES
from strata.rag.registry import available_retrievers
from strata.rag.strategy_plan import plan_for
from strata.strategy_table import DEFAULT_STRATEGY, STRATEGIES, STRATEGY_NAMES

PACKAGE = Path(__file__).resolve().parent.parent / "backend" / "strata"
TABLE = PACKAGE / "strategy_table.py"
# words that mean nothing but a strategy; "hybrid" is also a route, "adjacent" a merge kind, "fusion" a score stage
ONLY_STRATEGIES = {"basic", "auto_merge"}


def _python_literals(path: Path) -> list[tuple[int, str]]:
    """(line, value) of every string literal of a module that is exactly a strategy name."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if tok.type == tokenize.STRING and tok.string.strip("'\"") in STRATEGIES and tok.string[0] in "'\"":
            found.append((tok.start[0], tok.string.strip("'\"")))
    return found


def _script_literals(path: Path) -> list[tuple[int, str]]:
    pattern = re.compile(r"""["'`]({})["'`]""".format("|".join(STRATEGY_NAMES)))
    text = path.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in pattern.finditer(text)]


def _named_outside_the_table() -> dict[str, list[tuple[int, str]]]:
    named = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path == TABLE or path.suffix not in {".py", ".js", ".html"}:
            continue
        literals = _python_literals(path) if path.suffix == ".py" else _script_literals(path)
        if literals:
            named[str(path.relative_to(PACKAGE))] = literals
    return named


def test_no_source_file_but_the_table_lists_strategies() -> None:
    named = _named_outside_the_table()
    copies = {}
    for path, literals in named.items():
        by_line = defaultdict(set)
        for line, name in literals:
            by_line[line].add(name)
        if lists := [sorted(names) for names in by_line.values() if len(names) > 1]:
            copies[path] = lists
    assert not copies, f"a copy of the strategy list (derive it from strata.strategy_table): {copies}"
    only = {
        path: hits for path, literals in named.items() if (hits := [x for x in literals if x[1] in ONLY_STRATEGIES])
    }
    assert not only, f"a strategy named outside strata.strategy_table: {only}"


def test_settings_api_cli_console_registry_and_eval_list_the_table(tmp_path: Path) -> None:
    names = list(STRATEGY_NAMES)
    assert list(get_args(RetrievalSettings.model_fields["strategy"].annotation)) == names
    assert RetrievalSettings().strategy == DEFAULT_STRATEGY
    client = TestClient(create_app(Settings(_env_file=None, data_dir=tmp_path), warm_up=False))
    field = client.get("/openapi.json").json()["components"]["schemas"]["RetrieveRequest"]["properties"]["strategy"]
    assert field["anyOf"][0]["enum"] == names
    console = client.get("/ui/strategies").json()
    assert [row["name"] for row in console["strategies"]] == names and set(console["compare"]) <= set(names)
    query = next(
        a for a in build_parser()._subparsers._group_actions[0].choices["query"]._actions if a.dest == "strategy"
    )
    assert list(query.choices) == names
    assert list(RAG_STRATEGIES) == names and set(names) <= set(available_retrievers())
    assert [m for m in MODES if m not in SPEC_ROWS] == names


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_a_strategy_fixes_what_its_row_fixes_and_the_settings_tune_the_rest(name: str) -> None:
    row = STRATEGIES[name]
    for routes in ("hybrid", "dense", "sparse"):
        for merge_enabled in (True, False):
            plan = plan_for(name, routes=routes, merge_enabled=merge_enabled)
            assert plan.routes == (row.routes or routes)
            assert plan.merge == (row.merge or ("parents" if merge_enabled else "none"))
            assert plan.multi_query == row.multi_query


def test_auto_merge_on_the_dense_route_without_merging_searches_as_basic() -> None:
    tuned = plan_for(DEFAULT_STRATEGY, routes="dense", merge_enabled=False)
    basic = plan_for("basic")
    assert (tuned.routes, tuned.merge) == (basic.routes, basic.merge) and tuned.name != basic.name
