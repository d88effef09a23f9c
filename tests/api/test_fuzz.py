"""Schema fuzzing: schemathesis drives every operation of the app's own OpenAPI in-process.

Every check schemathesis has (``--checks all``) runs on every answer, for two tenants' keys
(each reads its own kb only): no 5xx, and every answer, to valid and to invalid data, is one
the document declares (status, content type, schema). Bounded to about a minute.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from strata.api import create_app
from strata.config import ApiKeyGrant, Settings
from strata.resources import Resources
from tests.api.conftest import KEYS, auth

EXAMPLES_PER_OPERATION = 8
TENANTS = ("garden-writer-key", "demo-reader-key")  # two tenants: garden (may write) and demo (reads)


@pytest.fixture(scope="module")
def fuzzed_app(stores: tuple[Settings, Resources]) -> Iterator[FastAPI]:
    base, resources = stores
    api = base.api.model_copy(update={"keys": {k: ApiKeyGrant(**v) for k, v in KEYS.items()}})
    app = create_app(base.model_copy(update={"api": api}), resources=resources, warm_up=False)
    with TestClient(app):  # runs the lifespan; the service stays on app.state for schemathesis's calls
        yield app


@pytest.fixture(scope="module")
def api_schema(fuzzed_app: FastAPI):  # noqa: ANN201 - schemathesis' schema type
    return schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)


def content_type(response) -> str:  # noqa: ANN001 - schemathesis' Response: headers map to lists
    values = {k.lower(): v for k, v in response.headers.items()}.get("content-type", [""])
    return values[0] if isinstance(values, list) else values


def operations(api_schema) -> list:  # noqa: ANN001
    return [result.ok() for result in api_schema.get_all_operations()]


def all_checks() -> list:
    load_all_checks()
    return list(CHECKS.get_all())


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_answer_is_declared_and_none_is_5xx(api_schema, mode: GenerationMode) -> None:  # noqa: ANN001
    """Valid and invalid requests to every operation, with each tenant's key, every check on every answer."""
    ops = operations(api_schema)
    assert len(ops) >= 10
    checks = all_checks()
    fuzzed = 0
    for operation in ops:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case) -> None:  # noqa: ANN001
            for key in TENANTS:
                response = case.call(headers=auth(key))
                label = f"{case.method} {case.formatted_path}"
                assert response.status_code < 500, f"{label} -> {response.status_code}: {response.text[:500]}"
                if response.status_code >= 400:
                    assert content_type(response).startswith("application/problem+json"), label
                case.validate_response(response, checks=checks, headers=auth(key))

        try:
            call()
            fuzzed += 1
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE, operation.label
    assert fuzzed >= (len(ops) if mode is GenerationMode.POSITIVE else 6)
