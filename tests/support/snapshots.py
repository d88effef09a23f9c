"""What the stores hold for a kb, read back for the tests to compare (``store_state``) and check on its own."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis
from sqlalchemy import and_, func, select

from strata.config import Settings
from strata.resources import Resources
from strata.stores.keys import database_namespace
from strata.stores.sql import ACTIVE, DocumentStore
from strata.stores.sql_schema import documents, version_terms
from strata.stores.term_stats import TermFrequencies


@dataclass(frozen=True)
class StoreState:
    """What the three stores hold for one kb."""

    versions: dict[tuple[str, int], str]  # (doc id, version) -> status
    sql_chunks: dict[int, frozenset[str]]  # level -> chunk ids of active versions
    sql_chunk_versions: frozenset[tuple[str, int]]  # (doc id, version) of every chunk row of the kb
    milvus_leaves: tuple[tuple[str, str, int], ...]  # (chunk id, doc id, version), sorted
    milvus_count: int
    redis_chunk_ids: frozenset[str] | None  # None without Redis

    @property
    def active(self) -> dict[str, int]:
        return {doc: v for (doc, v), status in self.versions.items() if status == ACTIVE}

    def assert_consistent(self) -> None:
        """Only active versions, each leaf once in Milvus, and Milvus leaves == SQL leaves of active versions."""
        assert set(self.versions.values()) <= {ACTIVE}, f"unfinished versions left: {self.versions}"
        assert self.sql_chunk_versions == set(self.active.items()), "chunk rows of a non-active version"
        milvus_ids = [leaf[0] for leaf in self.milvus_leaves]
        assert len(milvus_ids) == len(set(milvus_ids)) == self.milvus_count, "duplicate leaves in Milvus"
        assert set(milvus_ids) == self.sql_chunks[3], "Milvus and SQL disagree on the leaves"
        assert {(doc, v) for _, doc, v in self.milvus_leaves} <= set(self.active.items())
        if self.redis_chunk_ids is not None:
            assert self.redis_chunk_ids <= self.sql_chunks[1] | self.sql_chunks[2], "stale parents in Redis"


def assert_equal_but_renumbered(state: StoreState, clean: StoreState, doc_id: str, version: int) -> None:
    """``state`` holds what ``clean`` holds, except that ``doc_id`` serves as ``version``: the number a crashed or
    failed run gave its pending version is never given again, so the rerun's version is the next one."""
    assert state.active == {**clean.active, doc_id: version}
    assert {level: len(ids) for level, ids in state.sql_chunks.items()} == {
        level: len(ids) for level, ids in clean.sql_chunks.items()
    }
    assert state.milvus_count == clean.milvus_count
    others = [leaf for leaf in state.milvus_leaves if leaf[1] != doc_id]
    assert others == [leaf for leaf in clean.milvus_leaves if leaf[1] != doc_id]
    renumbered = [leaf for leaf in state.milvus_leaves if leaf[1] == doc_id]
    assert len(renumbered) == len(clean.milvus_leaves) - len(others) and {leaf[2] for leaf in renumbered} == {version}


def store_state(resources: Resources, kb_id: str) -> StoreState:
    documents = resources.documents
    versions = {(v.doc_id, v.version): v.status for v in documents.versions.of_kb(kb_id)}
    levels: dict[int, set[str]] = {1: set(), 2: set(), 3: set()}
    chunk_versions: set[tuple[str, int]] = set()
    for doc_id, version in versions:
        for chunk in documents.chunks.version_chunks(kb_id, doc_id, version):
            chunk_versions.add((doc_id, version))
            if versions[(doc_id, version)] == ACTIVE:
                levels[chunk.level].add(chunk.chunk_id)
    return StoreState(
        versions=versions,
        sql_chunks={level: frozenset(ids) for level, ids in levels.items()},
        sql_chunk_versions=frozenset(chunk_versions),
        milvus_leaves=tuple(sorted(milvus_leaves(resources, kb_id))),
        milvus_count=resources.leaf_index.count(kb_id),
        redis_chunk_ids=redis_chunk_ids(resources.settings, kb_id),
    )


def milvus_leaves(resources: Resources, kb_id: str) -> list[tuple[str, str, int]]:
    """Every leaf row of a kb in Milvus, at whatever isolation level it is (a Strong read of every id)."""
    return [(chunk_id, doc_id, version) for chunk_id, (doc_id, version) in resources.leaf_index.leaf_ids(kb_id).items()]


def redis_chunk_ids(settings: Settings, kb_id: str) -> frozenset[str] | None:
    """Chunk ids cached under ``{prefix}:{namespace}:{kb}:chunk:*``, or None when Redis is not configured."""
    if not settings.redis.url:
        return None
    client = redis.Redis.from_url(str(settings.redis.url))
    prefix = f"{settings.redis.key_prefix}:{database_namespace(settings.database.url)}:{kb_id}:chunk:"
    try:
        return frozenset(k.decode()[len(prefix) :] for k in client.scan_iter(match=f"{prefix}*", count=1000))
    finally:
        client.close()


def term_frequencies(store: DocumentStore, kb_ids: Sequence[str], terms: Sequence[str]) -> TermFrequencies:
    """The df of ``terms`` summed straight from the version terms of the active versions of ``kb_ids``
    (not from the kb sums the query path reads), and their leaves: the term bookkeeping checked on its own."""
    active = and_(
        documents.c.kb_id == version_terms.c.kb_id,
        documents.c.doc_id == version_terms.c.doc_id,
        documents.c.version == version_terms.c.version,
        documents.c.status == ACTIVE,
    )
    kbs = list(dict.fromkeys(kb_ids))
    with store.engine.connect() as conn:
        leaves = conn.execute(
            select(func.coalesce(func.sum(documents.c.leaf_count), 0)).where(
                documents.c.kb_id.in_(kbs), documents.c.status == ACTIVE
            )
        ).scalar_one()
        summed = conn.execute(
            select(version_terms.c.term, func.sum(version_terms.c.leaf_df))
            .join(documents, active)
            .where(version_terms.c.kb_id.in_(kbs), version_terms.c.term.in_([t for t in terms if t]))
            .group_by(version_terms.c.term)
        )
        df = {**dict.fromkeys(terms, 0), **{term: int(n) for term, n in summed}}
    return TermFrequencies(leaves=int(leaves), df=df)
