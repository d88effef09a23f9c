"""An upload of any size: sent in several requests, deleting only after the last, from the complete list.

The client's batch size is made tiny here (``strata.upload_batches.UPLOAD_FILES``), so a folder of a few
files takes several requests to the real app on a local HTTP server (``served_url``). A request
of more files than the service takes is refused naming the limit; a service whose upload does not take the
names sent before is refused before anything is sent; a ``--root-id`` naming the root a local run recorded
continues that kb's documents, and only a root of the kb written to.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from strata import upload_batches
from strata.api.problems import TYPE_BASE
from strata.api.uploads import MAX_FILES
from strata.client import StrataClient
from strata.config import Settings
from strata.errors import ServiceError
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.api.test_client import served_url  # noqa: F401 - the fixture: a real local HTTP server
from tests.support.api import auth

pytestmark = [pytest.mark.integration, pytest.mark.cost(30)]

ADMIN = auth("admin-key")


class Recording(httpx.BaseTransport):
    """The app's transport, recording each request's method, path and query."""

    def __init__(self, inner: httpx.BaseTransport) -> None:
        self.inner, self.requests = inner, []  # type: list[tuple[str, str, str]]

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests.append((request.method, request.url.path, request.url.query.decode()))
        return self.inner.handle_request(request)


def page(name: str) -> str:
    return f"# {name}\n\nThe {name} quay takes the ferry at dawn and the barge at dusk.\n"


def folder_of(root: Path, names: list[str]) -> list[tuple[str, Path]]:
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        (root / name).write_text(page(name), encoding="utf-8")
    return [(name, root / name) for name in names]


def served(client: TestClient, kb: str) -> list[str]:
    return sorted(d["doc_id"] for d in client.get(f"/kbs/{kb}/documents", headers=ADMIN).json()["documents"])


def test_a_folder_in_several_requests_deletes_only_what_is_gone_after_the_last(
    served_url: str, client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upload_batches, "UPLOAD_FILES", 3)
    kb, names = f"batches-{uuid.uuid4().hex[:6]}", [f"p{n}.md" for n in range(7)]
    transport = Recording(httpx.HTTPTransport())
    with StrataClient(served_url, "admin-key", transport=transport) as remote:
        first = remote.index_files(kb, folder_of(tmp_path / "docs", names), root="host:/docs", delete_missing=True)
        assert (first["added"], first["deleted"], first["failed"]) == (7, 0, 0), first
        uploads = [r for r in transport.requests if r[0] == "POST"]
        assert len(uploads) == 3 and ["delete_missing=true" in q for _, _, q in uploads] == [False, False, True]

        for gone in ("p1.md", "p5.md"):
            (tmp_path / "docs" / gone).unlink()
        kept = [n for n in names if n not in ("p1.md", "p5.md")] + ["p7.md"]
        again = remote.index_files(kb, folder_of(tmp_path / "docs", kept), root="host:/docs", delete_missing=True)
    assert (again["added"], again["unchanged"], again["deleted"], again["failed"]) == (1, 5, 2, 0), again
    assert served(client, kb) == sorted(kept)


def test_the_delete_refusal_counts_the_whole_folder_and_names_what_was_indexed(
    served_url: str, client: TestClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upload_batches, "UPLOAD_FILES", 2)
    kb, names = f"refusal-{uuid.uuid4().hex[:6]}", [f"q{n}.md" for n in range(6)]
    with StrataClient(served_url, "admin-key") as remote:
        remote.index_files(kb, folder_of(tmp_path / "docs", names), root="host:/docs")
        with pytest.raises(ServiceError) as refused:  # 4 of 6 gone: over half of the folder's documents
            remote.index_files(kb, folder_of(tmp_path / "docs", names[:2]), root="host:/docs", delete_missing=True)
    assert refused.value.status == 409 and "4 document(s)" in str(refused.value)
    assert served(client, kb) == sorted(names)


def test_a_request_of_more_files_than_the_service_takes_is_refused_naming_the_limit(client: TestClient) -> None:
    for count in (MAX_FILES + 1, MAX_FILES + 2):  # the route's own check; the form parser's limit (`present` aside)
        files = [("files", (f"f{n}.md", b"# F\n\nx\n", "text/markdown")) for n in range(count)]
        answer = client.post("/kbs/too-many/documents", files=files, headers=ADMIN)
        assert answer.status_code == 413, (count, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
        problem = answer.json()
        assert problem["type"] == TYPE_BASE + "too-many-files" and f"at most {MAX_FILES} files" in problem["detail"]
    assert client.get("/kbs/too-many/documents", headers=ADMIN).status_code == 404  # nothing was indexed


def test_the_present_part_is_checked_as_file_names_are(client: TestClient) -> None:
    files = [("files", ("a.md", b"# A\n\nx\n", "text/markdown"))]
    for present, why in ((b"{", "JSON"), (json.dumps(["../etc"]).encode(), "'..'"), (b'{"a": 1}', "JSON array")):
        answer = client.post(
            "/kbs/present-checked/documents",
            files=[*files, ("present", ("present.json", present, "application/json"))],
            params={"delete_missing": "true"},
            headers=ADMIN,
        )
        assert answer.status_code == 422 and why in answer.json()["detail"], answer.text


def test_a_service_that_does_not_take_several_requests_is_refused_before_anything_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upload_batches, "UPLOAD_FILES", 1)
    sent: list[str] = []

    def older_service(request: httpx.Request) -> httpx.Response:
        sent.append(f"{request.method} {request.url.path}")
        body = {"properties": {"files": {"type": "array"}}}  # its upload knows no `present` part
        return httpx.Response(200, json={"components": {"schemas": {"Body_upload": body}}})

    files = folder_of(tmp_path / "docs", ["a.md", "b.md"])
    older = StrataClient("http://old", transport=httpx.MockTransport(older_service))
    with older, pytest.raises(ServiceError, match="older than this client"):
        older.index_files("kb", files, root="host:/docs", delete_missing=True)
    assert sent == ["GET /openapi.json"]


def test_a_local_kb_is_continued_through_the_service_by_its_root_and_no_other_kb_can_claim_it(
    served_url: str, client: TestClient, stores: tuple[Settings, Resources], tmp_path: Path
) -> None:
    kb, other = f"moved-{uuid.uuid4().hex[:6]}", f"claim-{uuid.uuid4().hex[:6]}"
    docs = tmp_path / "docs"
    files = folder_of(docs, ["a.md", "b.md", "c.md"])
    assert Indexer(stores[1]).index_paths([docs], kb_id=kb).added == 3  # a local run: the root is the path
    (docs / "c.md").unlink()
    (docs / "a.md").write_text(page("a") + "\nThe quay was painted.\n", encoding="utf-8")
    with StrataClient(served_url, "admin-key") as remote:
        without = remote.index_files(kb, files[:2], root="host:" + str(docs))
        assert without["failed"] == 2 and "another folder" in without["failures"][0]["reason"], without
        report = remote.index_files(kb, files[:2], root="id:" + str(docs), delete_missing=True)
        assert (report["updated"], report["unchanged"], report["deleted"], report["failed"]) == (1, 1, 1, 0), report
        claimed = remote.index_files(other, files[1:2], root="id:" + str(docs))
    assert served(client, kb) == ["a.md", "b.md"]
    roots = {kb_id: {v.root for v in stores[1].documents.versions.of_kb(kb_id)} for kb_id in (kb, other)}
    assert roots == {kb: {str(docs)}, other: {"upload:id:" + str(docs)}}, roots
    assert claimed["added"] == 1
