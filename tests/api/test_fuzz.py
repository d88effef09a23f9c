"""Schema fuzzing: schemathesis drives every operation of the app's own OpenAPI in-process; no answer is a 5xx."""

from __future__ import annotations

from typing import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from strata.api import create_app
from strata.config import ApiKeyGrant, Settings
from strata.resources import Resources
from tests.api.conftest import KEYS, auth

EXAMPLES_PER_OPERATION = 25


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


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_operation_answers_5xx(api_schema, mode: GenerationMode) -> None:  # noqa: ANN001
    """Valid and invalid requests to every operation, each with a full-access and a read-only key."""
    ops = operations(api_schema)
    assert len(ops) >= 10
    fuzzed = 0
    for operation in ops:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def call(case) -> None:  # noqa: ANN001
            for headers in (auth("admin-key"), auth("demo-reader-key")):
                response = case.call(headers=headers)
                label = f"{case.method} {case.formatted_path}"
                assert response.status_code < 500, f"{label} -> {response.status_code}: {response.text[:500]}"
                if response.status_code >= 400:
                    assert content_type(response).startswith("application/problem+json"), label

        try:
            call()
            fuzzed += 1
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE, operation.label
    assert fuzzed >= (len(ops) if mode is GenerationMode.POSITIVE else 6)
