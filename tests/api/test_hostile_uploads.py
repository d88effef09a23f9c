"""Uploads of small files that are expensive to load: each fails with its reason at once, and the kb is free again.

A 51 KB .docx of two million empty paragraphs used to hold the kb's indexing lock for as long as python-docx
took (minutes to hours), so the next upload to the kb waited and timed out.
"""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from tests.hostile_documents import empty_paragraphs_docx, zip_bomb_docx
from tests.support.api import auth

ADMIN = auth("admin-key")
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


def test_a_hostile_docx_fails_with_its_reason_and_the_next_upload_indexes(client: TestClient) -> None:
    kb = f"hostile-{uuid.uuid4().hex[:8]}"
    files = [
        ("files", ("empty.docx", empty_paragraphs_docx(2_000_000), DOCX)),
        ("files", ("bomb.docx", zip_bomb_docx(300), DOCX)),
    ]

    failed = client.post(f"/kbs/{kb}/documents", files=files, headers=ADMIN)

    assert failed.status_code == 200, failed.text
    reasons = {f["source"]: f["reason"] for f in failed.json()["failures"]}
    assert reasons["empty.docx"].startswith(
        "docx has 2,000,001 paragraphs, more than STRATA_INDEXING__MAX_ELEMENTS (100,000)"
    )
    assert reasons["bomb.docx"].startswith("docx decompresses to ")
    assert "more than STRATA_INDEXING__MAX_DECOMPRESSED_BYTES (268,435,456)" in reasons["bomb.docx"]

    notes = [("files", ("harbour.md", b"# Harbour\n\nThe harbour gates open at dawn.\n", "text/markdown"))]
    indexed = client.post(f"/kbs/{kb}/documents", files=notes, headers=ADMIN)

    assert indexed.status_code == 200, indexed.text
    assert (indexed.json()["added"], indexed.json()["failed"]) == (1, 0)
