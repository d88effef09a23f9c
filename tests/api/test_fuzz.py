"""Schema fuzzing: schemathesis drives every operation of the app's own OpenAPI in-process.

Every check schemathesis has (``--checks all``) runs on every answer, for two tenants' keys
(each reads its own kb only): no 5xx, and every answer, to valid and to invalid data, is one
the document declares (status, content type, schema). Hypothesis's examples run here case by
case; schemathesis's own engine runs the phases ``schemathesis run`` does (the schema's
examples and the coverage phase: boundary values, methods a path lacks, OPTIONS) and the test
fails on any check's failure, listing them. A 504 is the one 5xx allowed: the declared answer
to a request whose own ``deadline_ms`` ran out. Bounded to a few minutes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events, from_schema

from strata.api import create_app
from strata.api.problems import TYPE_BASE
from strata.config import ApiKeyGrant, Settings
from strata.resources import Resources
from tests.support.api import KEYS, auth

pytestmark = pytest.mark.slow  # schemathesis fuzzes the API

EXAMPLES_PER_OPERATION = 8
DEADLINE_RAN_OUT = TYPE_BASE + "deadline-exceeded"
# what `schemathesis run --checks all --phases examples,coverage` does; fuzzing is the hypothesis test below
ENGINE_CONFIG = """
[generation]
mode = "all"
[phases.examples]
enabled = true
[phases.coverage]
enabled = true
[phases.fuzzing]
enabled = false
[phases.stateful]
enabled = false
[checks]
enabled = true
[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "504"]
"""
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
    return schemathesis.openapi.from_asgi(
        "/openapi.json", fuzzed_app, config=SchemathesisConfig.from_str(ENGINE_CONFIG)
    )


def content_type(response) -> str:
    values = {k.lower(): v for k, v in response.headers.items()}.get("content-type", [""])
    return values[0] if isinstance(values, list) else values


def operations(api_schema) -> list:
    return [result.ok() for result in api_schema.get_all_operations()]


def deadline_ran_out(response) -> bool:
    return response.status_code == 504 and response.json().get("type") == DEADLINE_RAN_OUT


def all_checks() -> list:
    load_all_checks()
    return list(CHECKS.get_all())


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_every_answer_is_declared_and_none_is_5xx(api_schema, mode: GenerationMode) -> None:
    """Valid and invalid requests to every operation, with each tenant's key, every check on every answer."""
    ops = operations(api_schema)
    assert len(ops) >= 10
    checks = all_checks()
    fuzzed = 0
    for operation in ops:

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=EXAMPLES_PER_OPERATION, deadline=None, suppress_health_check=list(HealthCheck), database=None
        )
        def call(case) -> None:
            for key in TENANTS:
                response = case.call(headers=auth(key))
                label = f"{case.method} {case.formatted_path}"
                assert response.status_code < 500 or deadline_ran_out(response), (
                    f"{label} -> {response.status_code}: {response.text[:500]}"
                )
                if response.status_code >= 400:
                    assert content_type(response).startswith("application/problem+json"), label
                case.validate_response(response, checks=checks, headers=auth(key))

        try:
            call()
            fuzzed += 1
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body)
            assert mode is GenerationMode.NEGATIVE, operation.label
    assert fuzzed >= (len(ops) if mode is GenerationMode.POSITIVE else 6)


def engine_failures(app: FastAPI, key: str) -> list[str]:
    """Every failed check (and engine error) of schemathesis's examples and coverage phases with ``key``."""
    config = SchemathesisConfig.from_str(ENGINE_CONFIG)
    config.projects.default.headers = auth(key)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config)
    failures: list[str] = []
    scenarios = 0
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            scenarios += 1
            failures += [
                f"{event.recorder.label} [{check.name}] {check.failure_info.failure.title}: "
                f"{str(check.failure_info.failure.message)[:300]}"
                for checks in event.recorder.checks.values()
                for check in checks
                if check.failure_info is not None
            ]
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            failures.append(f"engine error: {event}")
    assert scenarios >= 10, f"only {scenarios} scenarios ran"
    return sorted(set(failures))


@pytest.mark.parametrize("key", TENANTS)
def test_the_phases_of_schemathesis_run_find_no_violation(fuzzed_app: FastAPI, key: str) -> None:
    """Undeclared statuses, answers off their schema, a wrong content type, an Allow that misses a method."""
    failures = engine_failures(fuzzed_app, key)
    assert failures == [], "\n".join(failures)


def test_creating_a_kb_that_exists_answers_as_declared(api_schema) -> None:
    """A 200 the fuzzer rarely reaches (the kb must exist and the key may write it): checked by hand, every check."""
    case = api_schema["/kbs"]["POST"].Case(body={"kb_id": "garden"}, media_type="application/json")
    response = case.call(headers=auth("garden-writer-key"))
    assert response.status_code == 200 and response.json() == {"kb_id": "garden", "created": False}
    case.validate_response(response, checks=all_checks(), headers=auth("garden-writer-key"))
