"""The query-cache key: every setting is either in it or named as one that never changes a result."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from strata.config import Settings
from strata.rag.fingerprint import NOT_IN_RESULT, config_fingerprint


def every_setting(model: type[BaseModel], prefix: str = "") -> set[str]:
    """The dotted name of every field of ``model``, descending into fields typed as a settings section."""
    names = set()
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            names |= every_setting(field.annotation, f"{prefix}{name}.")
        else:
            names.add(f"{prefix}{name}")
    return names


def test_every_setting_is_in_the_key_or_in_the_exclusion_list() -> None:
    settings, keyed = every_setting(Settings), set(config_fingerprint(Settings(_env_file=None)))
    assert NOT_IN_RESULT - settings == set(), "NOT_IN_RESULT names settings that do not exist"
    assert settings - keyed - NOT_IN_RESULT == set(), "settings neither in the cache key nor in NOT_IN_RESULT"
    assert keyed & NOT_IN_RESULT == set()
    assert keyed - settings == set()


def changed(base: Settings, dotted: str, value: Any) -> Settings:
    section, name = dotted.split(".")
    return base.model_copy(update={section: getattr(base, section).model_copy(update={name: value})})


@pytest.mark.parametrize(
    ("dotted", "value"),
    [
        ("milvus.search_ef", 128),
        ("milvus.isolation", "partition_key"),
        ("embedding.max_length", 256),
        ("retrieval.rrf_k", 60),
    ],
)
def test_a_setting_that_changes_results_changes_the_key(dotted: str, value: Any) -> None:
    base = Settings(_env_file=None)
    assert config_fingerprint(changed(base, dotted, value)) != config_fingerprint(base)


@pytest.mark.parametrize(
    ("dotted", "value"),
    [("milvus.search_timeout_s", 9.0), ("database.pool_size", 20), ("redis.retry_after_s", 1.0), ("api.port", 9000)],
)
def test_an_excluded_setting_leaves_the_key_alone(dotted: str, value: Any) -> None:
    base = Settings(_env_file=None)
    assert config_fingerprint(changed(base, dotted, value)) == config_fingerprint(base)
