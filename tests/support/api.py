"""The service's test keys (tests/api/conftest.py builds the apps on them; their settings are
``tests.support.stores.make_settings(..., query_cache=True)``)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

KEYS = {
    "demo-reader-key": {"kbs": ["demo"], "write": False},
    "garden-writer-key": {"kbs": ["garden", "garden-uploads"], "write": True},
    "admin-key": {"kbs": ["*"], "write": True},
}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


AppFactory = Callable[..., TestClient]
