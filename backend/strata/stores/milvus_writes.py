"""The writes to one leaf collection: ``LeafWrites``.

Upserts (by chunk id, so a leaf written again overwrites), deletes by
version, document, kb or id, the flush that seals written rows, and dropping
the whole collection.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strata.stores import filters as expr
from strata.stores.keys import version_key
from strata.stores.leaf_rows import leaf_row
from strata.stores.milvus_calls import CALL_BATCH, CollectionCalls
from strata.stores.milvus_partitions import KbPartitions
from strata.types import Chunk


class LeafWrites:
    """Upserts, deletes and flushes the leaves of one collection."""

    def __init__(self, calls: CollectionCalls, partitions: KbPartitions) -> None:
        self._calls = calls
        self._partitions = partitions

    def upsert(self, leaves: Sequence[Chunk], vectors: np.ndarray, search_texts: Sequence[str]) -> None:
        """Writes leaves (same kb) with their vectors; the same ids overwrite."""
        if not leaves:
            return
        # the two checks below guard strata's own callers (the pipeline encodes and groups leaves per kb): a bug, not input
        if len(leaves) != len(vectors) or len(leaves) != len(search_texts):
            raise ValueError("leaves, vectors and search_texts differ in length")
        kb_ids = {leaf.kb_id for leaf in leaves}
        if len(kb_ids) != 1:  # as above: a bug, not input
            raise ValueError("upsert takes leaves of one knowledge base at a time")
        partition = self._partitions.partition_for_write(kb_ids.pop())
        rows = [leaf_row(leaf, vec, text) for leaf, vec, text in zip(leaves, vectors, search_texts)]
        for start in range(0, len(rows), CALL_BATCH):
            self._calls.call("upsert", self._calls.name, rows[start : start + CALL_BATCH], partition_name=partition)

    def delete_version(self, kb_id: str, doc_id: str, version: int) -> None:
        self._delete(kb_id, expr.eq("version_key", version_key(kb_id, doc_id, version)))

    def delete_document(self, kb_id: str, doc_id: str) -> None:
        self._delete(kb_id, expr.all_of(expr.eq("kb_id", kb_id), expr.eq("doc_id", doc_id)))

    def delete_kb(self, kb_id: str) -> None:
        self._delete(kb_id, expr.eq("kb_id", kb_id))

    def delete_leaves(self, kb_id: str, chunk_ids: Sequence[str]) -> None:
        """Deletes leaves by id (orphans found by ``strata reconcile --repair``)."""
        ids = list(chunk_ids)
        for start in range(0, len(ids), CALL_BATCH):
            self._delete(kb_id, expr.in_("chunk_id", ids[start : start + CALL_BATCH]))

    def _delete(self, kb_id: str, where: str) -> None:
        partitions = self._partitions.partitions_for([kb_id])
        if partitions == []:
            return  # the kb never had a partition: nothing to delete
        # pymilvus refuses an empty partition name: on the partition-key layout the filter's kb_id prunes
        in_partition = {"partition_name": partitions[0]} if partitions else {}
        self._calls.call("delete", self._calls.name, filter=where, **in_partition)

    def flush(self) -> None:
        """Seals written rows: unflushed rows make Lite searches 10-100x slower. Waits for them to be sealed,
        minutes after a large document on a loaded server: cut at ``STRATA_MILVUS__FLUSH_TIMEOUT_S``."""
        self._calls.call("flush", self._calls.name, timeout=self._calls.settings.flush_timeout_s)

    def drop_collection(self) -> None:
        """Drops the whole collection (benchmarks and tests that made one of their own)."""
        self._calls.call("drop_collection", self._calls.name)
