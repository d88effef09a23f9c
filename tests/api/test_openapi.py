"""The OpenAPI document says what the service does: its key, its errors, its limits; /docs is opt-in."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from tests.support.api import AppFactory


def test_the_document_declares_the_bearer_key_and_each_routes_problems(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearer"]["description"],
    }
    paths = doc["paths"]
    assert "security" not in paths["/health"]["get"]
    upload = paths["/kbs/{kb}/documents"]["post"]
    assert upload["security"] == [{"bearer": []}]
    assert {"400", "401", "403", "404", "408", "409", "413", "422", "503"} <= set(upload["responses"])
    problem = upload["responses"]["409"]["content"]
    assert list(problem) == ["application/problem+json"] and problem["application/problem+json"]["schema"][
        "$ref"
    ].endswith("ProblemOut")
    assert {"401", "404", "408", "413", "422", "503"} <= set(paths["/retrieve"]["post"]["responses"])
    assert {"401", "403"} <= set(paths["/metrics"]["get"]["responses"])


def test_a_request_at_the_published_limits_is_accepted(make_client: AppFactory) -> None:
    client = make_client(retrieval={"max_top_k": 7, "max_query_chars": 40})
    body = client.get("/openapi.json").json()["components"]["schemas"]["RetrieveRequest"]["properties"]
    top_k, chars = body["top_k"]["maximum"], body["query"]["maxLength"]
    assert (top_k, chars) == (7, 40)
    query = ("tomatoes watering " * 10)[:chars]
    assert client.post("/retrieve", json={"query": query, "top_k": top_k, "kb_ids": ["garden"]}).status_code == 200
    assert client.post("/retrieve", json={"query": query + "x", "top_k": top_k}).status_code == 422
    assert client.post("/retrieve", json={"query": query, "top_k": top_k + 1}).status_code == 422


def test_bounds_are_published_as_json_schema_keywords(make_client: AppFactory) -> None:
    """pydantic publishes a bound placed after a validator as an unknown key ("ge"), which no client reads."""
    document = make_client().get("/openapi.json").json()
    stray: list[str] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            stray.extend(f"{path}.{key}" for key in ("ge", "le", "gt", "lt") if key in node)
            for key, child in node.items():
                walk(child, f"{path}.{key}")
        elif isinstance(node, list):
            for n, child in enumerate(node):
                walk(child, f"{path}[{n}]")

    walk(document, "")
    assert stray == []
    body = document["components"]["schemas"]["RetrieveRequest"]["properties"]
    assert next(b for b in body["deadline_ms"]["anyOf"] if b.get("type") == "integer")["minimum"] == 1


def test_docs_are_off_unless_switched_on(make_client: AppFactory) -> None:
    assert make_client().get("/docs").status_code == 404
    assert make_client().get("/openapi.json").status_code == 200
    assert make_client(api={"docs": True}).get("/docs").status_code == 200
    assert "bearer" in make_client(api={"docs": True}).get("/openapi.json").json()["components"]["securitySchemes"]
