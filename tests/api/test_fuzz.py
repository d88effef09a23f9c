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

import re
from collections.abc import Iterator
from urllib.parse import quote

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
TENANTS = ("garden-writer-key", "demo-reader-key")
# the properties CI holds schemathesis to: no undeclared status, no answer off its schema or content type
CONFORMANCE = (
    "status_code_conformance",
    "response_schema_conformance",
    "content_type_conformance",
)  # two tenants: garden (may write) and demo (reads)


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
    ran: set[str] = set()
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            scenarios += 1
            ran |= {check.name for checks in event.recorder.checks.values() for check in checks}
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
    assert set(CONFORMANCE) <= ran, f"the conformance checks did not run: {sorted(ran)}"
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


# -- what schemathesis found against a real server, each case checked by hand ------------------------------------


def conformance_checks() -> list:
    """The two properties the fuzzing must hold: every status declared, every answer on its declared schema."""
    load_all_checks()
    found = [check for check in CHECKS.get_all() if check.__name__ in CONFORMANCE]
    assert {check.__name__ for check in found} == set(CONFORMANCE)
    return found


def test_a_deadline_that_runs_out_over_every_kb_answers_a_declared_504(api_schema) -> None:
    for path in ("/retrieve", "/retrieve/by-skill", "/retrieve/by-module"):
        body = {"query": "浇水 watering tomatoes", "deadline_ms": 1}
        if path != "/retrieve":
            body |= {"skill": "watering"} if path.endswith("skill") else {"module": "garden"}
        case = api_schema[path]["POST"].Case(body=body, media_type="application/json")
        response = case.call(headers=auth("garden-writer-key"))
        assert response.status_code == 504, (path, response.status_code, response.text[:300])
        case.validate_response(response, checks=conformance_checks(), headers=auth("garden-writer-key"))


def declared(app: FastAPI, path: str, method: str, response) -> None:
    """``response``'s status is one the document declares for the operation, with one of its content types."""
    operation = app.openapi()["paths"][path][method.lower()]
    answer = operation["responses"].get(str(response.status_code))
    assert answer is not None, f"{method} {path} -> undeclared {response.status_code}: {response.text[:300]}"
    media = response.headers["content-type"].split(";")[0]
    assert media in answer.get("content", {}), f"{method} {path} -> {response.status_code} as {media}"


UPLOAD = "/kbs/{kb}/documents"


@pytest.mark.parametrize(
    ("body", "refused"),
    [
        (b"--B--\r\n", 422),  # a multipart body with no parts
        (b'--B\r\nContent-Disposition: form-data; name="files"\r\n\r\n# a note\r\n--B--\r\n', 422),  # files as text
    ],
    ids=["no-parts", "files-as-text"],
)
def test_a_multipart_body_without_files_is_refused_as_declared(fuzzed_app: FastAPI, body: bytes, refused: int) -> None:
    headers = auth("garden-writer-key") | {"Content-Type": "multipart/form-data; boundary=B"}
    with TestClient(fuzzed_app) as client:
        response = client.post("/kbs/garden/documents", content=body, headers=headers)
    assert response.status_code == refused, response.text[:300]
    declared(fuzzed_app, UPLOAD, "POST", response)


def test_the_document_id_rule_is_in_the_schema(fuzzed_app: FastAPI) -> None:
    """The ids the schema's pattern allows are those the service takes: a control character (U+0000-U+001F,
    U+007F-U+009F) is refused by both, and a schema-valid id never gets the 422."""
    path = "/kbs/{kb}/documents/{doc_id}"
    (parameter,) = [p for p in fuzzed_app.openapi()["paths"][path]["delete"]["parameters"] if p["name"] == "doc_id"]
    pattern = re.compile(parameter["schema"]["pattern"])
    with TestClient(fuzzed_app) as client:
        for code in [*range(0x00, 0xA2), 0x2028, 0xFEFF, 0x1F600]:
            doc_id = f"notes{chr(code)}.md"
            if code in (0x0A, 0x23, 0x25, 0x2F, 0x3F):  # no route has a newline; # and ? end the path, % escapes
                continue
            response = client.delete(f"/kbs/garden/documents/{quote(doc_id)}", headers=auth("garden-writer-key"))
            assert (response.status_code == 422) == (pattern.fullmatch(doc_id) is None), (hex(code), response.text)
            declared(fuzzed_app, path, "DELETE", response)
