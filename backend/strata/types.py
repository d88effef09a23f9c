"""strata's domain records: frozen dataclasses shared by every layer.

Indexing turns files into ``SourceDocument`` and then ``Chunk`` records;
retrieval answers with a ``RetrievalResult`` (``RetrievedDocument`` list plus
``RetrievalMeta``). Records are immutable; stages derive new ones with
``dataclasses.replace``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

from strata.strategy_table import DEFAULT_STRATEGY

LEAF_LEVEL = 3

# Lifecycle of a document version: written ``pending``, served ``active``, ``retired`` until removed.
PENDING, ACTIVE, RETIRED = "pending", "active", "retired"


@dataclass(frozen=True)
class Section:
    """A structural span of a document: a heading's section or a PDF page.

    ``start``/``end`` are character offsets into ``SourceDocument.text``.
    """

    heading_path: tuple[str, ...]
    start: int
    end: int
    page: int | None = None


@dataclass(frozen=True)
class SourceDocument:
    """One loaded file: normalized text, its sections and its metadata."""

    doc_id: str
    source: str
    text: str
    sections: tuple[Section, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    content_hash: str = ""


@dataclass(frozen=True)
class Chunk:
    """A chunk of any level (1 = largest, 3 = leaf) of one document version."""

    chunk_id: str
    kb_id: str
    doc_id: str
    version: int
    level: int
    parent_id: str | None
    root_id: str
    ordinal: int
    text: str
    heading_path: str
    char_start: int
    char_end: int
    child_count: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_leaf(self) -> bool:
        return self.level == LEAF_LEVEL


@dataclass(frozen=True)
class LeafHit:
    """One search hit: the leaf and its route score (higher is better)."""

    chunk: Chunk
    score: float

    @property
    def chunk_id(self) -> str:
        return self.chunk.chunk_id


@dataclass(frozen=True)
class RouteHit:
    """One route's hit before its text is read: the leaf's id, its kb and the route score.

    Searches return no text (Milvus Lite spends a third of a search assembling fields); the texts
    of the fused candidates come from the parent store in one batch. ``source`` is filled only
    when a filter has to be checked on it.
    """

    chunk_id: str
    kb_id: str
    score: float
    source: str = ""


@dataclass(frozen=True)
class KnowledgeBase:
    """A knowledge base row: its encoder, chunking signature and index generation.

    ``epoch`` changes when the row is created anew, ``generation`` with every
    indexing change: together they never repeat, so they key the query cache.
    """

    kb_id: str
    encoder: str
    dim: int
    chunking: str
    generation: int
    epoch: str = ""


@dataclass(frozen=True)
class DocumentVersion:
    """One stored version of a document and its lifecycle status."""

    kb_id: str
    doc_id: str
    version: int
    source: str
    content_hash: str
    status: str = PENDING
    leaf_count: int = 0
    chunk_count: int = 0
    metadata: Mapping[str, Any] = field(default_factory=dict)
    root: str = ""  # the folder it was indexed from ("" = unknown: indexed before roots were recorded)


@dataclass(frozen=True)
class ServingState:
    """What a query needs from SQL: each kb's (epoch, generation), the versions to hide, and how many
    leaves each kb's active versions have (Milvus must hold them)."""

    generations: Mapping[str, Any]
    hidden_version_keys: tuple[str, ...]
    served_leaves: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Filters:
    """Optional restrictions of a search, ANDed together."""

    modules: tuple[str, ...] = ()
    skill_points: tuple[str, ...] = ()
    doc_ids: tuple[str, ...] = ()
    source_prefix: str | None = None

    def is_empty(self) -> bool:
        return not (self.modules or self.skill_points or self.doc_ids or self.source_prefix)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class RetrievedDocument:
    """One piece of evidence: its text, its final score and where it came from."""

    content: str
    score: float
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "score": _json_float(self.score), "metadata": _json_safe(self.metadata)}


Status = Literal["ok", "degraded", "failed"]
Mode = Literal["hybrid", "dense", "sparse", "dense_fallback", "sparse_fallback", "failed"]
RerankStatus = Literal["applied", "skipped", "failed"]
CacheState = Literal["hit", "miss", "shared", "off"]


@dataclass(frozen=True)
class StageError:
    """An error a stage recovered from (or died of)."""

    stage: str
    error: str
    message: str


@dataclass(frozen=True)
class MergeRound:
    """What one auto-merge round did."""

    round: int
    parents_merged: int = 0
    children_replaced: int = 0
    parents_missing: int = 0


@dataclass(frozen=True)
class RerankOutcome:
    """Whether rerank ran, and why not when it did not."""

    status: RerankStatus = "skipped"
    reason: str = "not configured"
    provider: str | None = None
    latency_ms: float | None = None


@dataclass(frozen=True)
class RetrievalMeta:
    """How the evidence was found: the record an engineer diagnoses with."""

    query: str
    top_k: int
    candidate_k: int
    status: Status = "ok"
    mode: Mode = "hybrid"
    kb_ids: tuple[str, ...] | None = None
    filters: Mapping[str, Any] = field(default_factory=dict)
    dense_candidates: int = 0
    sparse_candidates: int = 0
    fused_candidates: int = 0
    merge_rounds: tuple[MergeRound, ...] = ()
    rerank: RerankOutcome = RerankOutcome()
    returned: int = 0
    dropped_by_min_score: int = 0
    timings_ms: Mapping[str, float] = field(default_factory=dict)
    cache: CacheState = "off"
    parent_cache: Mapping[str, Any] = field(default_factory=dict)
    errors: tuple[StageError, ...] = ()
    degraded: tuple[str, ...] = ()
    strategy: str = DEFAULT_STRATEGY
    query_variants: tuple[str, ...] = ()
    expansion: Mapping[str, Any] = field(default_factory=dict)  # terms synonyms added to the BM25 query
    # what BM25 query hygiene left out: {"dropped": [...], "text": searched, "max_df": x}, {"skipped": why}, or {}
    bm25_query: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of the whole record."""
        return _json_safe(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetrievalMeta:
        fields = dict(data)
        fields["kb_ids"] = tuple(fields["kb_ids"]) if fields.get("kb_ids") is not None else None
        fields["merge_rounds"] = tuple(MergeRound(**r) for r in fields.get("merge_rounds", ()))
        fields["rerank"] = RerankOutcome(**fields.get("rerank", {}))
        fields["errors"] = tuple(StageError(**e) for e in fields.get("errors", ()))
        fields["degraded"] = tuple(fields.get("degraded", ()))
        fields["query_variants"] = tuple(fields.get("query_variants", ()))
        return cls(**fields)


@dataclass(frozen=True)
class RetrievalResult:
    """What ``retrieve_documents`` returns."""

    docs: tuple[RetrievedDocument, ...]
    meta: RetrievalMeta

    def to_dict(self) -> dict[str, Any]:
        return {"docs": [d.to_dict() for d in self.docs], "meta": self.meta.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetrievalResult:
        """The inverse of ``to_dict`` (used by the query cache and API clients)."""
        docs = tuple(
            RetrievedDocument(d["content"], float("nan") if d["score"] is None else d["score"], d["metadata"])
            for d in data["docs"]
        )
        return cls(docs=docs, meta=RetrievalMeta.from_dict(data["meta"]))


def _json_float(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in value]
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)
