"""An upload with ``delete_missing`` obeys the same safety catch as ``strata index --delete-missing``: over half of
the root's documents, or over ``max_delete``, it is a 409 ``delete-refused`` naming the count and nothing is
written; ``force`` and ``max_delete`` allow it; ``dry_run`` notes the refusal."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from strata.api.problems import TYPE_BASE
from tests.api.test_client import served_url  # noqa: F401 - the fixture: a real local HTTP server
from tests.support.api import auth

ADMIN = auth("admin-key")
PAGES = {
    f"{name}.md": f"# {name.title()}\n\nThe {name} quay takes ferries at dawn.\n".encode()
    for name in (
        "alpha",
        "beta",
        "gamma",
        "delta",
    )
}
ROOT = "host:/srv/notes"


def upload(client: TestClient, kb: str, names: list[str], **params: object) -> object:
    files = [("files", (name, PAGES[name], "text/markdown")) for name in names]
    query = {"root": ROOT, "delete_missing": "true", **{k: str(v).lower() for k, v in params.items()}}
    return client.post(f"/kbs/{kb}/documents", files=files, params=query, headers=ADMIN)


def documents(client: TestClient, kb: str) -> list[str]:
    return sorted(d["doc_id"] for d in client.get(f"/kbs/{kb}/documents", headers=ADMIN).json()["documents"])


@pytest.fixture
def kb(client: TestClient) -> str:
    kb = f"uploads-{uuid.uuid4().hex[:8]}"
    assert upload(client, kb, list(PAGES)).json()["added"] == len(PAGES)
    return kb


def test_an_upload_deleting_over_half_of_its_root_is_refused_naming_the_count(client: TestClient, kb: str) -> None:
    refused = upload(client, kb, ["alpha.md"])
    assert refused.status_code == 409, refused.text
    problem = refused.json()
    assert problem["type"] == TYPE_BASE + "delete-refused" and problem["status"] == 409
    assert "refused to delete 3 document(s)" in problem["detail"] and "force=true" in problem["detail"]
    assert documents(client, kb) == sorted(PAGES)

    planned = upload(client, kb, ["alpha.md"], dry_run=True)
    assert planned.status_code == 200 and planned.json()["deleted"] == 0
    assert any("would delete 3 document(s)" in note for note in planned.json()["notes"])

    forced = upload(client, kb, ["alpha.md"], force=True)
    assert forced.status_code == 200 and forced.json()["deleted"] == 3
    assert documents(client, kb) == ["alpha.md"]


def test_max_delete_caps_an_upload_and_allows_what_it_names(client: TestClient, kb: str) -> None:
    refused = upload(client, kb, ["alpha.md", "beta.md", "gamma.md"], max_delete=0)
    assert refused.status_code == 409 and "limit of 0 deletions" in refused.json()["detail"]
    assert "max_delete=1" in refused.json()["detail"]
    assert upload(client, kb, ["alpha.md"], max_delete=-1).status_code == 422

    allowed = upload(client, kb, ["alpha.md", "beta.md", "gamma.md"], max_delete=1)
    assert allowed.status_code == 200 and allowed.json()["deleted"] == 1
    assert documents(client, kb) == ["alpha.md", "beta.md", "gamma.md"]


def test_strata_index_server_refuses_as_the_local_command_does(
    served_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from strata.cli import main

    kb = f"remote-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "notes"
    folder.mkdir()
    for name, text in PAGES.items():
        (folder / name).write_bytes(text)
    command = ["index", str(folder), "--kb", kb, "--server", served_url, "--api-key", "admin-key", "--json"]
    assert main(command) == 0
    for name in ("beta.md", "gamma.md", "delta.md"):
        (folder / name).unlink()
    capsys.readouterr()

    assert main([*command, "--delete-missing"]) == 1
    assert "409 Deletion Refused" in (err := capsys.readouterr().err) and "refused to delete 3 document(s)" in err
    assert main([*command, "--delete-missing", "--force"]) == 0
    assert '"deleted": 3' in capsys.readouterr().out

    (folder / "alpha.md").unlink()
    assert main([*command, "--delete-missing", "--force"]) == 1  # an emptied folder: nothing sent, nothing deleted
    assert "holds no file to index" in capsys.readouterr().err
