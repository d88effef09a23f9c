"""``GET /ui`` and its two assets: served without a key, typed, under a policy that loads nothing from elsewhere.

The app is built without running its lifespan: the console's files need no stores.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from strata.api import create_app
from strata.api.routes.ui import STATIC
from strata.api.schemas import RetrieveRequest
from strata.config import ApiKeyGrant, Settings


@pytest.fixture
def client(tmp_path) -> TestClient:
    settings = Settings(_env_file=None, data_dir=tmp_path, api={"keys": {"k": ApiKeyGrant(kbs=["demo"])}})
    return TestClient(create_app(settings), raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("path", "content_type", "file"),
    [
        ("/ui", "text/html", "index.html"),
        ("/ui/app.js", "text/javascript", "app.js"),
        ("/ui/app.css", "text/css", "app.css"),
    ],
)
def test_console_files_are_served_without_a_key(client: TestClient, path: str, content_type: str, file: str) -> None:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == f"{content_type}; charset=utf-8"
    assert response.content == (STATIC / file).read_bytes()
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy


def test_the_page_loads_only_from_the_service() -> None:
    html = (STATIC / "index.html").read_text(encoding="utf-8")
    css = (STATIC / "app.css").read_text(encoding="utf-8")
    script = (STATIC / "app.js").read_text(encoding="utf-8")
    assert re.findall(r'(?:src|href)="([^"]+)"', html) == ["data:,", "/ui/app.css", "/ui/app.js"]
    assert "url(" not in css and "@import" not in css
    assert "innerHTML" not in script and "insertAdjacentHTML" not in script and "document.write" not in script
    assert "localStorage" not in script and "sessionStorage.setItem" in script


def test_retrieve_accepts_a_strategy_and_query_variants() -> None:
    body = RetrieveRequest(query="q", strategy="fusion", queries=["variant one", "variant two"])
    assert (body.strategy, body.queries) == ("fusion", ["variant one", "variant two"])
    with pytest.raises(ValidationError):
        RetrieveRequest(query="q", strategy="nearest")
