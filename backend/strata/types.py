"""strata's domain records: frozen dataclasses shared by every layer.

Indexing turns files into ``SourceDocument`` and then ``Chunk`` records;
retrieval answers with a ``RetrievalResult`` (``RetrievedDocument`` list plus
``RetrievalMeta``). Records are immutable; stages derive new ones with
``dataclasses.replace``.

The result's records are also their own wire format: ``strata.wire`` reads their fields and
attribute docstrings for their JSON (``to_dict``/``from_dict``), the service's answers, its OpenAPI
schema and the client's parsing, so a field is added in one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from strata.strategy_table import DEFAULT_STRATEGY
from strata.wire import WIRE, JsonFloat, JsonMapping, from_json, to_json

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
    """One loaded file: normalized text, its sections, its metadata, and its loader's notes.

    A note is something its user should know that did not fail the file, one line each: what the file
    names and strata did not read (an include, a snippet), markup its parser refused (a docutils error, an
    unclosed MkDocs admonition). An indexing run reports them per document (``IndexReport.warnings``).
    """

    doc_id: str
    source: str
    text: str
    sections: tuple[Section, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict)
    content_hash: str = ""
    notes: tuple[str, ...] = ()


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

    __pydantic_config__ = WIRE

    content: str
    """the evidence text (a merged parent, a leaf or adjacent leaves joined)"""
    score: JsonFloat
    """final score, higher is better; null when not finite or not ranked"""
    metadata: JsonMapping = field(default_factory=dict)
    """chunk_id, doc_id, kb_id, version, level, heading_path, source, char_start, char_end, hit_start and
    hit_end (the offsets of the leaves that hit: a merged parent's first hit leaf's start to its last one's end),
    cut (true when a character budget cut the text to the part that answered), the document's own metadata and,
    with explain, the score trace"""

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


Status = Literal["ok", "degraded", "failed"]
Mode = Literal["hybrid", "dense", "sparse", "dense_fallback", "sparse_fallback", "failed"]
RerankStatus = Literal["applied", "skipped", "failed"]
CacheState = Literal["hit", "miss", "shared", "off"]


@dataclass(frozen=True)
class StageError:
    """An error a stage recovered from (or died of)."""

    __pydantic_config__ = WIRE

    stage: str
    error: str
    """the error's type name, e.g. DeadlineExceeded"""
    message: str


@dataclass(frozen=True)
class MergeRound:
    """What one auto-merge round did."""

    __pydantic_config__ = WIRE

    round: int
    parents_merged: int = 0
    children_replaced: int = 0
    parents_missing: int = 0


@dataclass(frozen=True)
class RerankOutcome:
    """Whether rerank ran, and why not when it did not."""

    __pydantic_config__ = WIRE

    status: RerankStatus = "skipped"
    reason: str = "not configured"
    provider: str | None = None
    latency_ms: JsonFloat | None = None


@dataclass(frozen=True)
class RetrievalMeta:
    """How the evidence was found: the record an engineer diagnoses with.

    This is the record's one definition: its JSON (``to_dict``), the service's answer, the OpenAPI
    schema and the client's parsing all come from these fields (``strata.wire``). A new field is one
    line here, with a default and a docstring.
    """

    __pydantic_config__ = WIRE

    query: str
    top_k: int
    candidate_k: int
    """fused candidates kept before merging and rerank"""
    status: Status = "ok"
    """ok; degraded when a fallback answered (see degraded); failed"""
    mode: Mode = "hybrid"
    """the routes that answered"""
    kb_ids: tuple[str, ...] | None = None
    """knowledge bases searched; null = all"""
    filters: JsonMapping = field(default_factory=dict)
    """the filters applied; {} for none"""
    dense_candidates: int = 0
    sparse_candidates: int = 0
    fused_candidates: int = 0
    merge_rounds: tuple[MergeRound, ...] = ()
    rerank: RerankOutcome = RerankOutcome()
    returned: int = 0
    dropped_by_min_score: int = 0
    timings_ms: Mapping[str, JsonFloat] = field(default_factory=dict)
    """milliseconds per stage"""
    cache: CacheState = "off"
    """query cache: hit, miss, shared (answered by a concurrent identical query), off"""
    parent_cache: JsonMapping = field(default_factory=dict)
    """parent and leaf reads through the cache: hits and misses"""
    errors: tuple[StageError, ...] = ()
    degraded: tuple[str, ...] = ()
    """why the answer is degraded, one reason per fallback taken"""
    strategy: str = DEFAULT_STRATEGY
    """the retrieval strategy that ran"""
    query_variants: tuple[str, ...] = ()
    """the fusion strategy's query variants searched"""
    expansion: JsonMapping = field(default_factory=dict)
    """terms the synonyms added to the BM25 query; {} for none"""
    bm25_query: JsonMapping = field(default_factory=dict)
    """what BM25 query hygiene left out ({dropped, text, max_df}), {skipped: why}, or {}"""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict of the whole record."""
        return to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetrievalMeta:
        """The inverse of ``to_dict``: unknown fields are ignored, missing ones take their defaults."""
        return from_json(cls, data)


@dataclass(frozen=True)
class RetrievalResult:
    """What ``retrieve_documents`` returns: the evidence, best first, and how it was found."""

    __pydantic_config__ = WIRE

    docs: tuple[RetrievedDocument, ...]
    meta: RetrievalMeta

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RetrievalResult:
        """The inverse of ``to_dict`` (used by the query cache and API clients); a NaN score reads back as NaN."""
        return from_json(cls, data)
