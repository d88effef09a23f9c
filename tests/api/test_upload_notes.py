"""An upload's answer is the indexing report: a loader's notes are its warnings, the files named as sent."""

from __future__ import annotations

import uuid

from fastapi.testclient import TestClient

from tests.support.api import auth

ADMIN = auth("admin-key")

PAGE_MD = '# Install\n\nRun the installer.\n\n--8<-- "includes/proxy.md"\n'
PAGE_RST = "Lamp\n====\n\n+------+------+\n| Lens | Fresnel |\n+------+\n\nLit at dusk.\n"


def test_an_upload_reports_each_files_notes_as_warnings_named_as_sent(client: TestClient) -> None:
    kb = f"noted-{uuid.uuid4().hex[:8]}"
    files = [
        ("files", ("site/install.md", PAGE_MD.encode(), "text/markdown")),
        ("files", ("site/lamp.rst", PAGE_RST.encode(), "text/x-rst")),
    ]

    answer = client.post(f"/kbs/{kb}/documents", files=files, headers=ADMIN)

    assert answer.status_code == 200, answer.text
    report = answer.json()
    assert (report["added"], report["failed"]) == (2, 0)
    assert [(w["source"], w["note"].split(":")[0]) for w in report["warnings"]] == [
        ("site/install.md", "unresolved snippet 'includes/proxy.md' (--8<--)"),
        ("site/lamp.rst", "docutils error at line 5"),
    ]
    assert "Malformed table" in report["warnings"][1]["note"]
