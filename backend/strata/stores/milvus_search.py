"""The searches of one leaf collection: ids and scores per route, leaves by id.

``LeafSearch`` is what ``LeafCollection`` (``strata.stores.milvus_collection``)
searches with: it calls the collection through its ``CollectionCalls`` and
limits a search to the kbs asked for through its ``KbPartitions``. The routes
return ids and scores only: Milvus Lite spends much of a search assembling the
fields it returns, and the fused candidates' texts come from the chunk cache in
one batch. Each route takes several queries at once: one search with several
query vectors costs Milvus Lite its per-row masks once. On a Milvus Lite file
the routes call Lite's engine in this process (``strata.stores.lite_engine``)
instead of its loopback gRPC server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from strata.stores import filters as expr
from strata.stores.leaf_rows import SCALAR_FIELDS, leaf_chunk, route_fields, route_hit
from strata.stores.lite_engine import LiteEngine
from strata.stores.milvus_calls import CollectionCalls
from strata.stores.milvus_partitions import KbPartitions
from strata.types import Chunk, RouteHit


class LeafSearch:
    """The route searches and the leaf reads of one collection (``LeafCollection.searches``)."""

    def __init__(self, calls: CollectionCalls, partitions: KbPartitions, *, engine: LiteEngine | None) -> None:
        """``engine`` is Lite's engine in this process, if the collection is a Milvus Lite file this process
        holds."""
        self._calls = calls
        self._partitions = partitions
        self._engine = engine

    def search_dense_many(
        self,
        vectors: Sequence[np.ndarray],
        *,
        limit: int,
        kb_ids: Sequence[str] | None,
        where: str = "",
        timeout: float | None = None,
        with_source: bool = False,
    ) -> list[list[RouteHit]]:
        """Top leaves by inner product for each vector, in one search (ef raised to ``limit``).

        ``timeout`` cuts the search timeout; ``with_source`` also returns each leaf's source (for a
        filter checked after the search)."""
        if not vectors:
            return []
        ef = max(self._calls.settings.search_ef, limit)
        data = [np.asarray(v, dtype=np.float32).tolist() for v in vectors]
        result = self._route_search(data, "dense", "IP", {"ef": ef}, limit, kb_ids, where, timeout, with_source)
        return [[route_hit(h, h["distance"]) for h in hits] for hits in result]

    def search_sparse(
        self,
        text: str,
        *,
        limit: int,
        kb_ids: Sequence[str] | None,
        where: str = "",
        timeout: float | None = None,
        with_source: bool = False,
    ) -> list[RouteHit]:
        """Top leaves by BM25 against ``text``: ids and positive scores (``search_sparse_many`` of one)."""
        return self.search_sparse_many(
            [text], limit=limit, kb_ids=kb_ids, where=where, timeout=timeout, with_source=with_source
        )[0]

    def search_sparse_many(
        self,
        texts: Sequence[str],
        *,
        limit: int,
        kb_ids: Sequence[str] | None,
        where: str = "",
        timeout: float | None = None,
        with_source: bool = False,
    ) -> list[list[RouteHit]]:
        """Top leaves by BM25 for each text, in one search (Lite reports negated BM25; scores here
        are positive). A blank text finds nothing."""
        found: list[list[RouteHit]] = [[] for _ in texts]
        asked = [i for i, text in enumerate(texts) if text.strip()]
        if not asked:
            return found
        result = self._route_search(
            [texts[i] for i in asked], "sparse", "BM25", None, limit, kb_ids, where, timeout, with_source
        )
        for i, hits in zip(asked, result):
            found[i] = [route_hit(h, abs(h["distance"])) for h in hits]
        return found

    def _route_search(
        self,
        data: list[Any],
        field: str,
        metric: str,
        params: dict[str, Any] | None,
        limit: int,
        kb_ids: Sequence[str] | None,
        where: str,
        timeout: float | None,
        with_source: bool,
    ) -> list[list[Any]]:
        """One search of a route for ``data`` (a query each): on Lite's engine in this process when it is
        here, else through the client (cut at ``timeout``)."""
        partitions = self._partitions.partitions_for(kb_ids)
        if partitions == []:
            return [[] for _ in data]
        fields, full_where = route_fields(with_source), self._partitions.where(kb_ids, where)
        if self._engine is not None:
            found = self._engine.search(
                data,
                anns_field=field,
                metric_type=metric,
                search_params=params,
                limit=limit,
                expr=full_where,
                output_fields=fields,
                partition_names=partitions,
            )
            if found is not None:
                return found
        return self._calls.call(
            "search",
            self._calls.name,
            data=data,
            anns_field=field,
            limit=limit,
            filter=full_where,
            output_fields=fields,
            search_params={"metric_type": metric, **({"params": params} if params else {})},
            partition_names=partitions,
            timeout=self._calls.cut(timeout),
        )

    def fetch_leaves(self, refs: Sequence[tuple[str, str]], *, timeout: float | None = None) -> dict[str, Chunk]:
        """Leaves by (kb id, chunk id) with their text, from the index itself: the source of leaf
        texts when neither the chunk cache nor SQL can answer."""
        found: dict[str, Chunk] = {}
        by_kb: dict[str, list[str]] = {}
        for kb_id, chunk_id in refs:
            by_kb.setdefault(kb_id, []).append(chunk_id)
        for kb_id, ids in by_kb.items():
            partitions = self._partitions.partitions_for([kb_id])
            if partitions == []:
                continue
            rows = self._calls.call(
                "query",
                self._calls.name,
                filter=expr.in_("chunk_id", ids),
                output_fields=["chunk_id", *SCALAR_FIELDS],
                partition_names=partitions,
                timeout=self._calls.cut(timeout),
            )
            found.update((str(r["chunk_id"]), leaf_chunk(r)) for r in rows)
        return found
