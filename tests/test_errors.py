"""One exception tree: every exception class strata defines is a ``StrataError``."""

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
from strata.errors import StrataError
from strata.rag.deadline import DeadlineExceeded
from strata.stores.analyzer import UnsupportedAnalyzer

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


def test_the_second_bases_keep_old_except_clauses_working() -> None:
    assert strata.errors.ConfigError is ConfigError  # strata.config's name for it stays valid
    assert issubclass(ConfigError, ValueError) and issubclass(UnsupportedAnalyzer, ValueError)
    assert issubclass(DeadlineExceeded, TimeoutError)
    exc = DeadlineExceeded("rerank")
    assert str(exc) == "deadline_exceeded: no time left for rerank within the request deadline"


def test_every_class_of_the_tree_is_drawn_in_the_errors_docstring() -> None:
    drawn = strata.errors.__doc__ or ""
    missing = sorted(c.__name__ for c in exception_classes() - NOT_ERRORS - {StrataError} if f"── {c.__name__} " not in drawn)
    assert missing == []
