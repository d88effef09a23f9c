"""The error table: every class of strata's exception tree has its own row, and each row answers as it says."""

from __future__ import annotations

import importlib
import pkgutil
from http import HTTPStatus

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import strata
from strata.api.problems import ERROR_TABLE, MEDIA_TYPE, TYPE_BASE, install, refusal_of
from strata.errors import LeaseHeldError, LeavesMissingError, StoreError, StrataError

pytestmark = pytest.mark.unit

SCRIPTS = ("__main__", "migrations")  # act on import (the CLI, Alembic's env.py) and define no errors


def strata_error_classes() -> set[type[StrataError]]:
    """``StrataError`` and every subclass, after importing every module of the package."""
    for module in pkgutil.walk_packages(strata.__path__, "strata."):
        if not any(part in SCRIPTS for part in module.name.split(".")):
            importlib.import_module(module.name)
    found, todo = set(), [StrataError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_class_of_the_tree_has_a_row_of_its_own() -> None:
    classes = strata_error_classes()
    assert {"DeadlineExceeded", "UnsupportedAnalyzer", "ServiceError", "LeaseHeldError"} <= {
        c.__name__ for c in classes
    }
    rows = [cls for cls, _ in ERROR_TABLE]
    assert sorted(c.__qualname__ for c in classes - set(rows)) == []  # a new error class needs its answer here
    assert len(rows) == len(set(rows))


def test_no_row_is_shadowed_by_an_earlier_more_general_one() -> None:
    for index, (cls, refusal) in enumerate(ERROR_TABLE):
        earlier = [base.__name__ for base, _ in ERROR_TABLE[:index] if issubclass(cls, base)]
        assert earlier == [], f"{cls.__name__} is answered by {earlier[0]}'s row, not its own"
        assert refusal_of(cls) is refusal


def test_every_row_is_a_problem_type_of_its_own_with_an_error_status() -> None:
    refusals = [refusal for _, refusal in ERROR_TABLE]
    for refusal in refusals:
        assert 400 <= refusal.status < 600 and HTTPStatus(refusal.status)
        assert refusal.slug and refusal.slug == refusal.slug.lower() and " " not in refusal.slug
    slugs = {r.slug: r for r in refusals}
    assert all(slugs[r.slug] == r for r in refusals)  # one slug, one answer (rows may share a Refusal)


def build_app(error: Exception) -> TestClient:
    app = FastAPI()
    install(app)

    @app.get("/fail")
    def fail() -> None:
        raise error

    return TestClient(app, raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("error", "status", "slug"),
    [
        (LeaseHeldError("held by web-1:pid 7:ab", kb_id="alpha", retry_after_s=42.2), 409, "kb-being-written"),
        (LeavesMissingError("1 of 9 leaves ... `strata reconcile --kb alpha --repair`"), 503, "leaves-missing"),
        (StoreError("SQL store postgresql://db-host/strata failed"), 503, "store-unavailable"),
    ],
)
def test_an_error_answers_by_its_row(error: Exception, status: int, slug: str) -> None:
    response = build_app(error).get("/fail")
    assert response.status_code == status
    assert response.headers["content-type"] == MEDIA_TYPE
    body = response.json()
    assert body["type"] == TYPE_BASE + slug and body["status"] == status


def test_a_held_lease_says_when_to_retry_without_naming_the_holder() -> None:
    response = build_app(LeaseHeldError("held by web-1:pid 7:ab", kb_id="alpha", retry_after_s=42.2)).get("/fail")
    assert response.headers["retry-after"] == "43"
    assert "'alpha'" in response.json()["detail"] and "web-1" not in response.json()["detail"]


def test_missing_leaves_name_the_repair_and_a_store_outage_hides_its_address() -> None:
    missing = build_app(LeavesMissingError("12 of 30 leaves ... `strata reconcile --kb alpha --repair`")).get("/fail")
    assert "leaves" in missing.json()["detail"] and "strata reconcile --kb alpha --repair" in missing.json()["detail"]
    assert "retry-after" not in missing.headers  # waiting does not bring them back
    down = build_app(StoreError("SQL store postgresql://db-host/strata failed")).get("/fail")
    assert "db-host" not in down.json()["detail"] and down.headers["retry-after"] == "5"
