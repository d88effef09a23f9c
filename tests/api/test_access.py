"""Two keys with different kbs never see each other's documents: search, cache, by-module, by-skill, listings."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from tests.support.api import auth

DEMO = auth("demo-reader-key")  # kbs: demo, read only
GARDEN = auth("garden-writer-key")  # kbs: garden, garden-uploads, write
ADMIN = auth("admin-key")  # kbs: *, write


def kbs_of(response) -> set[str]:
    assert response.status_code == 200, response.text
    return {d["metadata"]["kb_id"] for d in response.json()["docs"]}


def test_each_key_searches_only_its_kbs_also_through_the_cache(client: TestClient) -> None:
    query = {"query": f"how often should tomatoes be watered {uuid.uuid4().hex[:6]}", "top_k": 5}
    first = client.post("/retrieve", json=query, headers=DEMO)
    assert kbs_of(first) == {"demo"} and first.json()["meta"]["kb_ids"] == ["demo"]
    assert client.post("/retrieve", json=query, headers=DEMO).json()["meta"]["cache"] == "hit"
    garden = client.post("/retrieve", json=query, headers=GARDEN)  # the same query: another cache entry
    assert kbs_of(garden) == {"garden"} and garden.json()["meta"]["cache"] == "miss"
    assert garden.json()["meta"]["kb_ids"][0] == "garden"  # and garden-uploads once it exists
    everything = client.post("/retrieve", json=query, headers=ADMIN)
    assert everything.json()["meta"]["kb_ids"] is None and "garden" in kbs_of(everything)


def test_a_kb_the_key_cannot_read_looks_like_one_that_does_not_exist(client: TestClient) -> None:
    hidden = client.post("/retrieve", json={"query": "tomatoes", "kb_ids": ["garden"]}, headers=DEMO)
    missing = client.post("/retrieve", json={"query": "tomatoes", "kb_ids": ["no-such-kb"]}, headers=ADMIN)
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["detail"].replace("garden", "X") == "no knowledge base 'X'"
    assert missing.json()["title"] == hidden.json()["title"]
    mixed = client.post("/retrieve", json={"query": "tomatoes", "kb_ids": ["demo", "garden"]}, headers=DEMO)
    assert mixed.status_code == 404  # never a silent narrowing to the readable part
    for path in ("/kbs/garden/documents", "/kbs/garden/stats"):
        assert client.get(path, headers=DEMO).status_code == 404
    assert {k["kb_id"] for k in client.get("/kbs", headers=DEMO).json()["kbs"]} == {"demo"}


def test_by_module_sees_only_the_modules_of_the_keys_kbs(client: TestClient) -> None:
    refused = client.post("/retrieve/by-module", json={"module": "garden"}, headers=DEMO)
    assert refused.status_code == 404
    assert "garden" not in {c["module"] for c in refused.json()["closest"]}
    assert kbs_of(client.post("/retrieve/by-module", json={"module": "garden"}, headers=GARDEN)) == {"garden"}
    assert kbs_of(client.post("/retrieve/by-module", json={"module": "garden", "query": "soil"}, headers=GARDEN)) == {
        "garden"
    }
    assert client.post("/retrieve/by-module", json={"module": "billing"}, headers=GARDEN).status_code == 404


def test_by_skill_sees_only_the_skill_points_of_the_keys_kbs(client: TestClient) -> None:
    demo = client.post("/retrieve/by-skill", json={"skill": "watering", "top_k": 5}, headers=DEMO)
    assert demo.json()["skill"]["matched_skill_points"] == [] and kbs_of(demo) <= {"demo"}
    garden = client.post("/retrieve/by-skill", json={"skill": "watering", "top_k": 5}, headers=GARDEN)
    assert garden.json()["skill"]["matched_skill_points"] == ["watering"] and kbs_of(garden) == {"garden"}


def test_writes_stay_inside_the_keys_kbs(client: TestClient) -> None:
    files = [("files", ("tips.md", b"# Tips\n\nMulch keeps the soil moist in July heat waves.", "text/markdown"))]
    assert client.post("/kbs/demo/documents", files=files, headers=GARDEN).status_code == 404
    assert client.post("/kbs", json={"kb_id": "elsewhere"}, headers=GARDEN).status_code == 404
    uploaded = client.post("/kbs/garden-uploads/documents", files=files, headers=GARDEN)
    assert uploaded.status_code == 200 and uploaded.json()["added"] + uploaded.json()["unchanged"] == 1
    query = {"query": "mulch in heat waves", "top_k": 3}
    assert "garden-uploads" in kbs_of(client.post("/retrieve", json=query, headers=GARDEN))
    assert "garden-uploads" not in kbs_of(client.post("/retrieve", json=query, headers=DEMO))


def test_keys_from_a_file_and_the_single_full_access_key(make_client, tmp_path) -> None:
    import json

    from pydantic import SecretStr

    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"file-key": {"kbs": ["garden"]}}), encoding="utf-8")
    client = make_client(api={"keys_file": keys_file, "api_key": SecretStr("the-admin-secret")})
    assert {k["kb_id"] for k in client.get("/kbs", headers=auth("file-key")).json()["kbs"]} == {"garden"}
    files = [("files", ("x.md", b"# X\n\nText.", "text/markdown"))]
    assert (
        client.post("/kbs/garden/documents", files=files, headers=auth("file-key")).status_code == 403
    )  # write: false
    assert {"demo", "garden"} <= {
        k["kb_id"] for k in client.get("/kbs", headers=auth("the-admin-secret")).json()["kbs"]
    }
    assert client.get("/kbs", headers=auth("demo-reader-key")).status_code == 401  # only the configured keys count


def test_no_answer_of_the_service_shows_a_configured_key(client: TestClient) -> None:
    from tests.support.api import KEYS

    client.post("/retrieve", json={"query": "tomatoes", "top_k": 2}, headers=GARDEN)
    answers = [
        client.get(path, headers=headers)
        for path in ("/health", "/ready", "/ready/detail", "/metrics", "/openapi.json", "/kbs")
        for headers in (ADMIN, auth("not-a-key-0123456789"), {})
    ]
    assert {a.status_code for a in answers} >= {200, 401}
    service = client.app.state.service
    shown = [a.text + str(a.headers) for a in answers] + [repr(service.settings), str(service.settings)]
    assert not [key for key in KEYS for text in shown if key in text or key.upper() in text]
