"""One exception tree: every exception class strata defines is a ``StrataError``, defined in ``strata.errors``."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
from pathlib import Path

import strata
import strata.errors
from strata.api.problems import Problem
from strata.config import ConfigError
from strata.errors import DeadlineExceeded, StrataError, UnsupportedAnalyzer

# The service's HTTP answer: raised in routes and always turned into a problem document.
NOT_ERRORS = {Problem}


@functools.cache
def exception_classes() -> frozenset[type[BaseException]]:
    """Every exception class defined in a module of the package.

    Only modules whose source defines a class are imported: scripts that act on import
    (``strata.cli.__main__``, Alembic's ``env.py``) define none.
    """
    root = Path(strata.__file__).parent
    found: set[type[BaseException]] = set()
    for path in sorted(root.rglob("*.py")):
        if not any(isinstance(node, ast.ClassDef) for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))):
            continue
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        for value in vars(module).values():
            if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == module.__name__:
                found.add(value)
    return frozenset(found)


def test_every_exception_strata_defines_is_a_strata_error() -> None:
    classes = exception_classes()
    names = {c.__name__ for c in classes}
    assert {"ConfigError", "DeadlineExceeded", "UnsupportedAnalyzer", "ServiceError", "StoreError"} <= names
    outside = sorted(c.__qualname__ for c in classes - NOT_ERRORS if not issubclass(c, StrataError))
    assert outside == []


def test_every_exception_class_is_defined_in_the_errors_module() -> None:
    elsewhere = sorted(f"{c.__module__}.{c.__qualname__}" for c in exception_classes() - NOT_ERRORS)
    assert [name for name in elsewhere if not name.startswith("strata.errors.")] == []


def test_the_second_bases_keep_old_except_clauses_working() -> None:
    assert strata.errors.ConfigError is ConfigError  # strata.config's name for it stays valid
    assert issubclass(ConfigError, ValueError) and issubclass(UnsupportedAnalyzer, ValueError)
    assert issubclass(DeadlineExceeded, TimeoutError)
    exc = DeadlineExceeded("rerank")
    assert str(exc) == "deadline_exceeded: no time left for rerank within the request deadline"


def test_every_class_of_the_tree_is_drawn_in_the_errors_docstring() -> None:
    drawn = strata.errors.__doc__ or ""
    missing = sorted(
        c.__name__ for c in exception_classes() - NOT_ERRORS - {StrataError} if f"── {c.__name__} " not in drawn
    )
    assert missing == []


# The library refuses input with InvalidArgumentError (and settings with ConfigError, a file with LoaderError); a
# plain ValueError or TypeError is left where pydantic expects one (a validator: it becomes a ValidationError) or
# where it marks strata's own bug, which a comment on the raise or the line before it says ("bug", "not input").
# The rule covers every module of the package, indexing/ and cli/ included.
PLAIN = {"ValueError", "TypeError"}
VALIDATOR_DECORATORS = ("field_validator", "model_validator")
VALIDATOR_HELPERS = {"_not_blank"}  # called by validators only (strata.config): pydantic needs their ValueError


def _plain_raises(path: Path) -> list[tuple[int, str]]:
    """``(line, enclosing function)`` of each ``raise ValueError(...)`` / ``raise TypeError(...)`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node
        if (
            isinstance(node, ast.Raise)
            and isinstance(node.exc, ast.Call)
            and isinstance(node.exc.func, ast.Name)
            and node.exc.func.id in PLAIN
            and not _is_validator(function)
        ):
            found.append((node.lineno, function.name if function else ""))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def _is_validator(function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> bool:
    """A pydantic validator (``VALIDATOR_DECORATORS``), or a helper only validators call (``VALIDATOR_HELPERS``)."""
    if function is None:
        return False
    names = {ast.unparse(d.func if isinstance(d, ast.Call) else d) for d in function.decorator_list}
    return function.name in VALIDATOR_HELPERS or any(n.endswith(VALIDATOR_DECORATORS) for n in names)


def test_plain_value_and_type_errors_are_only_in_validators_or_marked_as_bugs() -> None:
    root = Path(strata.__file__).parent
    unmarked = []
    for path in sorted(root.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        for line, function in _plain_raises(path):
            said = " ".join(lines[max(0, line - 3) : line]).lower()
            if "bug" not in said and "not input" not in said:
                unmarked.append(f"{path.relative_to(root)}:{line} ({function})")
    assert unmarked == []  # raise InvalidArgumentError (input) or ConfigError (a setting), or say why it is a bug


def test_the_sweep_finds_a_plain_raise_and_exempts_only_validators(tmp_path: Path) -> None:
    module = tmp_path / "example.py"
    module.write_text(
        "class S(BaseSettings):\n"
        "    @field_validator('x')\n"
        "    @classmethod\n"
        "    def check(cls, v):\n"
        "        raise ValueError('pydantic turns this into a ValidationError')\n"
        "\n"
        "def _not_blank(v):\n"
        "    raise ValueError('only validators call this')\n"
        "\n"
        "def refuse(v):\n"
        "    raise ValueError('refused input')\n",
        encoding="utf-8",
    )
    assert _plain_raises(module) == [(11, "refuse")]
