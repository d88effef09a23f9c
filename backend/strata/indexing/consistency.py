"""Whether Milvus holds what SQL serves for a kb: the leaf count, and a probe of every served version.

A count cannot tell a Milvus restored from an older snapshot: it holds as many
leaves, of older versions, and would pass. Leaf ids are deterministic (kb,
document, version, level, ordinal), so the first and the last leaf of every
version SQL serves are known from the document rows alone, without reading a
chunk; asking Milvus for them by primary key reads no vector. A served version
whose probe leaves are absent is not what Milvus serves. ``strata stats``, the
service's stats and an indexing run's start all use this one check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from strata.indexing.chunking import chunk_id
from strata.types import ACTIVE, LEAF_LEVEL, DocumentVersion, KnowledgeBase
from strata.wire import WIRE, to_json

NAMED = 5  # documents named in a difference; the count says how many more


class StoredVersions(Protocol):
    """What the stats ask of SQL (``DocumentStore.versions``)."""

    def of_kb(self, kb_id: str, doc_id: str | None = None) -> list[DocumentVersion]: ...

    def stats(self, kb_id: str) -> dict[str, Any]: ...


class LeafCounter(Protocol):
    """What the check asks of the leaf index."""

    def count(self, kb_id: str) -> int: ...

    def present(self, kb_id: str, chunk_ids: Sequence[str]) -> set[str]: ...


@dataclass(frozen=True)
class LeafCheck:
    """SQL's served leaves against Milvus's: counts, and the served versions whose probe leaves are absent."""

    kb_id: str
    expected: int
    found: int
    versions_probed: int
    absent: tuple[str, ...] = ()  # "doc v3" of the first served versions found absent
    absent_count: int = 0

    @property
    def consistent(self) -> bool:
        return self.found == self.expected and self.absent_count == 0

    def difference(self) -> str:
        """One line naming what differs ("" when nothing does)."""
        parts = []
        if self.found > self.expected:
            parts.append(
                f"Milvus holds {self.found} leaves where SQL serves {self.expected}: {self.found - self.expected} "
                "orphan or unserved leaves (a run that lost its lease, a restored backup); `strata reconcile` "
                "names them and `--repair` deletes them, and queries leave them out (`unserved_leaves`)"
            )
        elif self.found != self.expected:
            parts.append(f"Milvus holds {self.found} leaves where SQL serves {self.expected}")
        if self.absent_count:
            more = f" and {self.absent_count - len(self.absent)} more" if self.absent_count > len(self.absent) else ""
            older = ": Milvus holds other versions (restored from an older backup?)" if self.found else ""
            parts.append(
                f"{self.absent_count} of {self.versions_probed} served versions have no leaves in Milvus "
                f"({', '.join(self.absent)}{more}){older}"
            )
        return "; ".join(parts)


def probe_ids(kb_id: str, versions: Sequence[DocumentVersion], most: int | None = None) -> dict[str, DocumentVersion]:
    """The first and last leaf id of every active version with leaves (of ``most`` of them, evenly spread over
    the kb's documents, when given): chunk id -> its version."""
    served = [v for v in versions if v.status == ACTIVE and v.leaf_count > 0]
    if most is not None and len(served) > most:
        served = served[:: -(-len(served) // most)]  # every k-th document: at most ``most``
    probes: dict[str, DocumentVersion] = {}
    for v in served:
        for ordinal in {0, v.leaf_count - 1}:
            probes[chunk_id(kb_id, v.doc_id, v.version, LEAF_LEVEL, ordinal)] = v
    return probes


def check_leaves(
    index: LeafCounter, kb_id: str, versions: Sequence[DocumentVersion], *, most: int | None = None
) -> LeafCheck:
    """Counts the kb's leaves in Milvus and probes the served versions, every one or ``most`` of them (an
    indexing run's start: on Milvus Lite each batch of 500 ids reads every row); raises ``StoreError``."""
    expected = sum(v.leaf_count for v in versions if v.status == ACTIVE)
    probes = probe_ids(kb_id, versions, most)
    found = index.count(kb_id)
    present = index.present(kb_id, list(probes)) if probes else set()
    absent: dict[tuple[str, int], None] = {}  # ordered: the first served versions found absent
    for leaf, v in probes.items():
        if leaf not in present:
            absent[(v.doc_id, v.version)] = None
    named = tuple(f"{doc} v{version}" for doc, version in list(absent)[:NAMED])
    probed = len({(v.doc_id, v.version) for v in probes.values()})
    return LeafCheck(kb_id, expected, found, probed, named, len(absent))


@dataclass(frozen=True)
class KbEncoder:
    """The encoder a kb was indexed with."""

    __pydantic_config__ = WIRE

    name: str
    dim: int


@dataclass(frozen=True)
class KbStats:
    """What ``strata stats --json`` and ``GET /kbs/{kb}/stats`` answer: SQL's counts, Milvus's, and whether they
    agree. This class is the answer's one definition (its JSON and its OpenAPI schema: ``strata.wire``)."""

    __pydantic_config__ = WIRE

    kb: str
    documents: int
    """documents the kb serves (active versions)"""
    documents_by_status: dict[str, int]
    """document versions by status (pending, active, retired)"""
    chunks_by_level: dict[str, int]
    """chunks of the served versions by level ("1", "2", "3")"""
    leaves_in_milvus: int
    versions_probed: int
    """served versions whose first and last leaf were looked up in Milvus by id"""
    versions_absent_in_milvus: int
    """probed versions whose leaves Milvus does not hold"""
    encoder: KbEncoder
    generation: int
    """the kb's counter of changes to what it serves"""
    consistent: bool
    """Milvus holds exactly the leaves SQL serves"""
    difference: str
    """what differs, in one line ("" when nothing does)"""

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def kb_stats(versions: StoredVersions, index: LeafCounter, kb: KnowledgeBase) -> KbStats:
    """SQL's counts, Milvus's, and whether they agree (counts and every served version probed by id;
    ``difference`` names what does not)."""
    sql = versions.stats(kb.kb_id)
    check = check_leaves(index, kb.kb_id, versions.of_kb(kb.kb_id))
    return KbStats(
        kb=kb.kb_id,
        documents=sql["documents_by_status"].get("active", 0),
        documents_by_status=sql["documents_by_status"],
        chunks_by_level=sql["chunks_by_level"],
        leaves_in_milvus=check.found,
        versions_probed=check.versions_probed,
        versions_absent_in_milvus=check.absent_count,
        encoder=KbEncoder(kb.encoder, kb.dim),
        generation=kb.generation,
        consistent=check.consistent and check.found == sql["chunks_by_level"]["3"],
        difference=check.difference(),
    )
