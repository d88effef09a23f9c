"""Where a call on some kbs looks in one leaf collection: ``KbPartitions``.

On the ``partition`` layout each kb has a partition of its own: a call names
the kbs' partitions, and a kb's first write creates its partition (at most
``STRATA_MILVUS__MAX_PARTITIONS``). On the other layouts a call searches the
whole collection under a ``kb_id`` filter (``single``: the collection holds
one kb).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from strata.errors import StoreError
from strata.stores import filters as expr
from strata.stores.keys import partition_name
from strata.stores.milvus_calls import CollectionCalls


class KbPartitions:
    """The partitions and the kb filter of calls on kbs of one collection."""

    def __init__(self, calls: CollectionCalls, *, per_kb: bool, listed: Iterable[str]) -> None:
        """``per_kb``: the collection has a partition per kb; ``listed``: the partitions it held when opened."""
        self._calls = calls
        self._per_kb = per_kb
        self._partitions: set[str] = set(listed)
        self._lock = threading.Lock()

    def where(self, kb_ids: Sequence[str] | None, where: str) -> str:
        """``where`` limited to ``kb_ids`` (None: every kb) where partitions do not keep them apart."""
        kb_clause = None if self._per_kb or kb_ids is None else expr.in_("kb_id", list(kb_ids))
        return expr.all_of(kb_clause, where)

    def partitions_for(self, kb_ids: Sequence[str] | None) -> list[str] | None:
        """Partitions to search: None = the whole collection; [] = nothing to search.

        A kb written by another process after this one listed the partitions is found by listing
        them again on a miss: a kb that exists is never searched as empty.
        """
        if not self._per_kb or kb_ids is None:
            return None
        wanted = [partition_name(k) for k in kb_ids]
        if any(p not in self._partitions for p in wanted):
            self._refresh()
        return [p for p in wanted if p in self._partitions]

    def partition_for_write(self, kb_id: str) -> str | None:
        """The partition the kb's leaves are written to, created on its first write (None: no partitions)."""
        if not self._per_kb:
            return None
        name = partition_name(kb_id)
        if name not in self._partitions:
            self._refresh()
        if name not in self._partitions:
            held = sum(1 for name in self._partitions if name != "_default")
            settings = self._calls.settings
            if held >= settings.max_partitions:
                raise StoreError(
                    f"knowledge base {kb_id!r} would be kb partition {held + 1:,} of Milvus collection "
                    f"{self._calls.name!r}, over STRATA_MILVUS__MAX_PARTITIONS ({settings.max_partitions:,}; Milvus "
                    "refuses more than rootCoord.maxPartitionNum, 1,024 by default). Move the kbs to the collection "
                    "level (strata rebuild --to-uri URI --isolation collection) or raise both limits"
                )
            self._calls.call("create_partition", self._calls.name, name)
            with self._lock:
                self._partitions.add(name)
        return name

    def _refresh(self) -> None:
        listed = set(self._calls.call("list_partitions", self._calls.name))
        with self._lock:
            self._partitions |= listed
