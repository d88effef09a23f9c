"""What each stage of a retrieval run returns when it ends: frozen outcomes, one kind per stage.

Every outcome carries the stage's errors, reason codes, timings and parent-store
reads (``StageOutcome``); its kind adds what the stage produced. Stages build them
with a ``StageLog`` (``strata.rag.run_state``) and hand them to ``RunState.add``;
only ``RunState.result`` reads them together, into the meta record.

=====================  ===========================  ==========================================
stage                  outcome                      what goes into the meta record
=====================  ===========================  ==========================================
bm25_query             ``BM25QueryOutcome``         ``bm25_query`` (``record()``)
encode                 ``EncodeOutcome``            errors, reason codes
search (per variant)   ``SearchOutcome``            ``mode``, candidate counts
fusion                 ``FusionOutcome``            ``fused_candidates``
merge                  ``MergeOutcome``             ``merge_rounds``
rerank                 ``RerankStageOutcome``       ``rerank``
finalize               ``FinalizeOutcome``          ``returned``, ``dropped_by_min_score``, docs
query_cache            ``CacheOutcome``             ``cache``; a reused record (hit, shared)
=====================  ===========================  ==========================================
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata.rag.candidates import Candidate
from strata.types import (
    CacheState,
    MergeRound,
    Mode,
    RerankOutcome,
    RetrievalResult,
    RetrievedDocument,
    StageError,
)


@dataclass(frozen=True)
class StageOutcome:
    """What one stage reported when it ended: its errors, reason codes, timings and parent-store reads."""

    stage: str
    errors: tuple[StageError, ...] = ()
    degraded: tuple[str, ...] = ()
    timings_ms: tuple[tuple[str, float], ...] = ()
    parent_cache: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class BM25QueryOutcome(StageOutcome):
    """BM25 query pruning: the text BM25 searches, the query terms left out of it, or why nothing was pruned."""

    text: str = ""
    dropped: tuple[str, ...] = ()
    max_df: float = 1.0
    skipped: str = ""

    def record(self) -> dict[str, Any]:
        """The meta record's ``bm25_query``: what was left out, why nothing was, or ``{}`` (pruning off)."""
        if self.skipped:
            return {"skipped": self.skipped}
        if self.dropped:
            return {"dropped": list(self.dropped), "text": self.text, "max_df": self.max_df}
        return {}


@dataclass(frozen=True, eq=False)
class EncodeOutcome(StageOutcome):
    """The query vectors (one per query), or None: BM25 only, or the encoder failed."""

    vectors: tuple[Any, ...] | None = None

    def vector(self, i: int) -> Any:
        return self.vectors[i] if self.vectors is not None else None


@dataclass(frozen=True)
class SearchOutcome(StageOutcome):
    """One query's (one variant's) search: the candidates with their leaves, and the mode it ran in
    (``failed``: no route answered, or the leaves found could not be read)."""

    variant: str = ""
    mode: Mode = "failed"
    candidates: tuple[Candidate, ...] = ()
    dense: int = 0
    sparse: int = 0
    fused: int = 0


@dataclass(frozen=True)
class FusionOutcome(StageOutcome):
    """The ``fusion`` strategy's variants fused by N-list RRF."""

    candidates: tuple[Candidate, ...] = ()
    fused: int = 0


@dataclass(frozen=True)
class MergeOutcome(StageOutcome):
    """The candidates after merging, and what each auto-merge round did (none for adjacent merging, or
    when no time was left to merge)."""

    candidates: tuple[Candidate, ...] = ()
    rounds: tuple[MergeRound, ...] = ()


@dataclass(frozen=True)
class RerankStageOutcome(StageOutcome):
    """The candidates in their final order (the service's, or the fused order it fell back to) and the
    meta record's ``rerank`` (applied, skipped or failed, and why)."""

    candidates: tuple[Candidate, ...] = ()
    record: RerankOutcome = RerankOutcome()

    @property
    def applied(self) -> bool:
        """Whether the scores are the reranker's (the min-score cut then uses ``min_score``)."""
        return self.record.status == "applied"


@dataclass(frozen=True)
class FinalizeOutcome(StageOutcome):
    """The documents returned (top_k, after the min-score cut) and how many the cut dropped."""

    docs: tuple[RetrievedDocument, ...] = ()
    dropped: int = 0


@dataclass(frozen=True)
class CacheOutcome(StageOutcome):
    """The query cache: where the result came from (``off``: not consulted; ``miss``: this run computed it;
    ``hit`` / ``shared``: another call did, and ``reused`` is its result)."""

    source: CacheState = "off"
    reused: RetrievalResult | None = None
