"""The candidate record that flows through fusion, merging, rerank and finalize."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from strata.types import Chunk


@dataclass(frozen=True)
class Trace:
    """How a candidate got its score (the per-doc trace of the meta record)."""

    dense_rank: int | None = None
    dense_score: float | None = None
    sparse_rank: int | None = None
    sparse_score: float | None = None
    fused_score: float | None = None
    rerank_score: float | None = None
    score_stage: str = "fusion"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Candidate:
    """A chunk (leaf or merged parent) with its current score, best first in lists."""

    chunk: Chunk
    score: float
    trace: Trace = Trace()
    merged_from: tuple[str, ...] = field(default=())
    hit_span: tuple[int, int] | None = None  # a merged parent's: from its first hit leaf's start to its last one's end

    @property
    def chunk_id(self) -> str:
        return self.chunk.chunk_id

    def hits(self) -> tuple[int, int]:
        """The document offsets of the text that hit: a leaf's own span, a merged parent's hit leaves' span."""
        return self.hit_span or (self.chunk.char_start, self.chunk.char_end)

    def ancestors(self) -> tuple[str, ...]:
        """Ids of the chunks that contain this one (parent, then root)."""
        ids = [i for i in (self.chunk.parent_id, self.chunk.root_id) if i and i != self.chunk.chunk_id]
        return tuple(dict.fromkeys(ids))
