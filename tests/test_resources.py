"""``Resources``: parts are given at construction and used as given, never assigned afterwards, and ``close``
releases every part, built or given. No store is opened: the parts are fakes that record what is asked of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strata.config import Settings
from strata.resources import Resources
from tests.support.stores import make_settings

PARTS = [name for name, value in vars(Resources).items() if isinstance(value, property)]


class Part:
    """A stand-in for a store: records the chunk reads asked of it and how it was released."""

    def __init__(self) -> None:
        self.chunks = self  # a ``DocumentStore``'s chunk reads
        self.asked: list[list[str]] = []
        self.released: list[str] = []

    def get_chunks(self, chunk_ids: list[str], *, timeout_s: float | None = None) -> dict[str, Any]:
        self.asked.append(list(chunk_ids))
        return {}

    def close(self) -> None:
        self.released.append("close")

    def dispose(self) -> None:
        self.released.append("dispose")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'strata.sqlite3'}", redis_url=None)


def test_the_parts_given_are_used_as_given_and_released_by_close(settings: Settings) -> None:
    documents, leaf_index, cached_chunks = Part(), Part(), Part()
    resources = Resources(settings, documents=documents, leaf_index=leaf_index, cached_chunks=cached_chunks)

    assert resources.documents is documents and resources.cached_chunks is cached_chunks
    assert resources.leaf_index is leaf_index and resources.open_leaf_index() is leaf_index
    resources.close()
    assert (documents.released, leaf_index.released, cached_chunks.released) == (["dispose"], ["close"], ["close"])


def test_a_part_built_over_a_given_one_uses_it(settings: Settings) -> None:
    documents = Part()
    resources = Resources(settings, documents=documents)

    resources.cached_chunks.get_many([("kb", "c1")])  # the in-process cache is empty: a miss read from SQL

    assert documents.asked == [["c1"]]
    resources.close()
    assert documents.released == ["dispose"]


@pytest.mark.parametrize("name", PARTS)
def test_no_part_can_be_assigned_after_construction(settings: Settings, name: str) -> None:
    resources = Resources(settings)
    with pytest.raises(AttributeError):
        setattr(resources, name, Part())


def test_the_assignment_matrix_holds_every_part() -> None:
    assert {"encoder", "documents", "leaf_index", "cached_chunks", "redis_breaker"} <= set(PARTS)
