"""The counts and id reads of one leaf collection: ``LeafReads``.

What the indexer and ``strata stats`` ask of the collection besides the
searches (``milvus_search``): how many leaves a kb, document or version has,
which ids it holds, their dense vectors, and whether the server answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pymilvus.exceptions import MilvusException

from strata.errors import StoreError
from strata.stores import filters as expr
from strata.stores.keys import version_key
from strata.stores.milvus_calls import CALL_BATCH, CollectionCalls
from strata.stores.milvus_partitions import KbPartitions

QUERY_WINDOW = 16_384  # most rows a Milvus server returns for one query (offset + limit)


class LeafReads:
    """Counts, ids and vectors of the leaves of one collection, and its readiness probe."""

    def __init__(self, calls: CollectionCalls, partitions: KbPartitions, *, kb_id: str | None) -> None:
        """``kb_id``: the one kb of a collection of the ``collection`` isolation level (None: a shared one)."""
        self._calls = calls
        self._partitions = partitions
        self._kb = kb_id

    def count(self, kb_id: str, *, doc_id: str | None = None, version: int | None = None) -> int:
        """Leaves of a kb, or of one document (version)."""
        partitions = self._partitions.partitions_for([kb_id])
        if partitions == []:
            return 0
        if doc_id is not None and version is not None:
            where = expr.eq("version_key", version_key(kb_id, doc_id, version))
        else:
            where = expr.all_of(expr.eq("kb_id", kb_id), expr.eq("doc_id", doc_id) if doc_id is not None else None)
        if self._calls.on_lite:
            return self._lite_count(where, partitions, whole_kb=doc_id is None)
        rows = self._read(where, ["count(*)"], partitions)
        return int(rows[0]["count(*)"]) if rows else 0

    def count_versions(self, kb_id: str, versions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Leaves of each ``(doc_id, version)`` of a kb, in one read of their ids' version keys (the indexer's
        check of a written group: a filtered count per document made indexing quadratic on Milvus Lite, whose
        filtered reads scan every row, and cost a round trip per document on a server). A group holding more
        leaves than one read returns (``QUERY_WINDOW``) is counted version by version."""
        partitions = self._partitions.partitions_for([kb_id])
        found = dict.fromkeys(versions, 0)
        if partitions == [] or not versions:
            return found
        keys = {version_key(kb_id, d, v): (d, v) for d, v in versions}
        on_lite = self._calls.on_lite
        window = {} if on_lite else {"limit": QUERY_WINDOW, "consistency_level": "Strong"}
        rows = self._calls.call(
            "query",
            self._calls.name,
            filter=expr.in_("version_key", sorted(keys)),
            output_fields=["version_key"],
            partition_names=partitions,
            timeout=self._calls.settings.count_timeout_s,
            **window,
        )
        if not on_lite and len(rows) >= QUERY_WINDOW:
            return {(d, v): self.count(kb_id, doc_id=d, version=v) for d, v in versions}
        for row in rows:
            found[keys[row["version_key"]]] += 1
        return found

    def _lite_count(self, where: str, partitions: list[str] | None, *, whole_kb: bool) -> int:
        """Milvus Lite answers ``count(*)`` under a filter by materialising every matching row, vectors
        included (5 GB for 200,000 leaves): a kb in a partition of its own is counted from ids alone,
        anything else by its ids."""
        if whole_kb and partitions:
            return int(self._calls.call("get_partition_stats", self._calls.name, partitions[0])["row_count"])
        if whole_kb and self._kb is not None:
            return int(self._calls.call("get_collection_stats", self._calls.name)["row_count"])
        rows = self._calls.call(
            "query",
            self._calls.name,
            filter=where,
            output_fields=["chunk_id"],
            partition_names=partitions,
            timeout=self._calls.settings.count_timeout_s,
        )
        return len(rows)

    def leaf_ids(self, kb_id: str) -> dict[str, tuple[str, int]]:
        """Every leaf of a kb in the collection: chunk id -> (doc id, version)."""
        partitions = self._partitions.partitions_for([kb_id])
        if partitions == []:
            return {}
        found: dict[str, tuple[str, int]] = {}
        name = self._calls.name
        try:
            iterator = self._calls.client.query_iterator(
                name,
                batch_size=4096,
                filter=expr.eq("kb_id", kb_id),
                output_fields=["chunk_id", "doc_id", "version"],
                partition_names=partitions,
                timeout=self._calls.settings.count_timeout_s,
                consistency_level="Strong",
            )
            while batch := iterator.next():
                found.update({r["chunk_id"]: (r["doc_id"], int(r["version"])) for r in batch})
            iterator.close()
        except MilvusException as exc:
            raise StoreError(f"Milvus query_iterator on {name!r} failed: {exc}") from exc
        return found

    def present(self, kb_id: str, chunk_ids: Sequence[str]) -> set[str]:
        """Which of ``chunk_ids`` the collection holds for ``kb_id`` (by primary key, a batch at a time, no
        vector read): the consistency probe of ``strata stats`` and of an indexing run's start."""
        partitions = self._partitions.partitions_for([kb_id])
        ids = list(dict.fromkeys(chunk_ids))
        if partitions == [] or not ids:
            return set()
        found: set[str] = set()
        for start in range(0, len(ids), CALL_BATCH):
            where = self._partitions.where([kb_id], expr.in_("chunk_id", ids[start : start + CALL_BATCH]))
            found.update(row["chunk_id"] for row in self._read(where, ["chunk_id"], partitions))
        return found

    def dense_vectors(self, kb_id: str, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The dense vectors the collection holds for ``chunk_ids`` of ``kb_id`` (a resumed write's check)."""
        partitions = self._partitions.partitions_for([kb_id])
        ids = list(dict.fromkeys(chunk_ids))
        if partitions == [] or not ids:
            return {}
        rows = self._read(self._partitions.where([kb_id], expr.in_("chunk_id", ids)), ["chunk_id", "dense"], partitions)
        return {row["chunk_id"]: np.asarray(row["dense"], dtype=np.float32) for row in rows}

    def _read(self, where: str, fields: list[str], partitions: list[str] | None) -> list[dict[str, Any]]:
        """A query of ``fields`` where ``where`` holds, Strong (an indexer reads right after its flush, and a
        Bounded read on a server may miss those rows), cut at ``STRATA_MILVUS__COUNT_TIMEOUT_S``."""
        rows: list[dict[str, Any]] = self._calls.call(
            "query",
            self._calls.name,
            filter=where,
            output_fields=fields,
            partition_names=partitions,
            consistency_level="Strong",
            timeout=self._calls.settings.count_timeout_s,
        )
        return rows

    def holds_any(self, kb_id: str) -> bool:
        """Whether the collection holds any leaf of ``kb_id`` (one row asked for, cut at the search timeout)."""
        partitions = self._partitions.partitions_for([kb_id])
        if partitions == []:
            return False
        rows = self._calls.call(
            "query",
            self._calls.name,
            filter=expr.eq("kb_id", kb_id),
            output_fields=["chunk_id"],
            limit=1,
            partition_names=partitions,
            timeout=self._calls.settings.search_timeout_s,
        )
        return bool(rows)

    def ping(self) -> dict[str, Any]:
        """One metadata call to the server, cut at the search timeout (readiness: no count, no data read);
        raises ``StoreError`` when the server does not answer or the collection is gone."""
        name = self._calls.name
        if not self._calls.call("has_collection", name, timeout=self._calls.settings.search_timeout_s):
            raise StoreError(f"Milvus collection {name!r} does not exist (dropped after it was opened?)")
        return {"collection": name}
