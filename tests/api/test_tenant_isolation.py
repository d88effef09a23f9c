"""A write key learns nothing of another kb from its uploads: not from the embedding cache, not from the BM25 dictionary.

The key of these tests writes one kb of its own and cannot read ``demo``
(examples/kb, indexed first, so its modules are in the collection's BM25
dictionary). Whatever it uploads, the report must read the same whether or
not ``demo`` holds the same texts or terms.
"""

from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient

from tests.support.api import AppFactory, auth
from tests.support.paths import EXAMPLES_KB

WRITER_KEY = "tenant-writer-key-0123456789"


def _writer(make_client: AppFactory) -> tuple[TestClient, str]:
    from strata.config import ApiKeyGrant

    kb = f"tenant-{uuid.uuid4().hex[:8]}"
    client = make_client(api={"keys": {WRITER_KEY: ApiKeyGrant(kbs=[kb], write=True)}})
    return client, kb


def _upload(client: TestClient, kb: str, name: str, body: bytes, **params: Any) -> dict[str, Any]:
    files = [("files", (name, body, "text/markdown"))]
    response = client.post(f"/kbs/{kb}/documents", files=files, params=params, headers=auth(WRITER_KEY))
    assert response.status_code == 200, response.text
    assert response.json()["failed"] == 0, response.json()
    return response.json()


def test_an_upload_reuses_only_the_vectors_its_own_kb_encoded(make_client: AppFactory) -> None:
    client, kb = _writer(make_client)
    copy = (EXAMPLES_KB / "auth.md").read_bytes()  # a document of demo, which this key cannot read

    first = _upload(client, kb, "auth.md", copy)
    assert first["passages_encoded"] > 0
    assert first["embeddings_reused"] == 0  # demo's cached vectors of the very same texts are not this kb's

    again = _upload(client, kb, "auth.md", copy, recreate="true")  # every document a new version: the kb's own cache
    assert (again["passages_encoded"], again["embeddings_reused"]) == (0, first["passages_encoded"])


def test_upload_notes_read_the_same_whether_or_not_another_kb_has_the_term(make_client: AppFactory) -> None:
    client, kb = _writer(make_client)
    guess = f"guess{uuid.uuid4().hex[:8]}"  # in no kb; "auth" is a module of demo, so in the BM25 dictionary
    notes = {}
    for n, module in enumerate(("auth", guess)):
        doc = f"---\nmodule: {module}\n---\n# Notes {n}\n\nSomething worth knowing, number {n}.\n"
        report = _upload(client, kb, f"doc{n}.md", doc.encode())
        notes[module] = [note.replace(module, "TERM") for note in report["notes"]]
    assert notes["auth"] == notes[guess]
    assert len(notes[guess]) == 1 and "(TERM)" in notes[guess][0]  # the term is still named: it is the caller's own
