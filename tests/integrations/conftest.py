"""The indexed knowledge base shared by the adapter tests (built once per test module)."""

from __future__ import annotations

import pytest

from strata.config import Settings
from tests.integrations.kb import index_demo_and_garden


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory, memo_encoder) -> Settings:
    return index_demo_and_garden(tmp_path_factory.mktemp("integrations"), memo_encoder)
