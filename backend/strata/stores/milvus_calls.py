"""The client calls on one leaf collection: ``CollectionCalls``.

Every part of a collection (its writes, reads and searches) calls Milvus
through ``call``: the general timeout unless the call names its own, errors
translated to ``StoreError`` (a deadline to ``StoreTimeoutError`` naming the
setting), and the collection loaded again when the server has it released.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from strata.config import MilvusSettings
from strata.errors import StoreError
from strata.stores.store_timeouts import is_grpc_deadline, milvus_bound, timed_out

logger = logging.getLogger(__name__)

CALL_BATCH = 500  # rows one upsert sends, ids one delete or id query names
_COLLECTION_NOT_LOADED = 101  # Milvus's error code (merr) for a collection that is not loaded


class CollectionCalls:
    """Calls on the collection ``name`` through ``client``, cut at the settings' timeouts."""

    def __init__(self, client: MilvusClient, settings: MilvusSettings, name: str, *, on_lite: bool) -> None:
        """``on_lite``: the other end is Milvus Lite (``connect``'s answer)."""
        self.client = client
        self.settings = settings
        self.name = name
        self.on_lite = on_lite

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """The client's ``method`` on the arguments, cut at ``STRATA_MILVUS__TIMEOUT_S`` unless ``timeout`` is given."""
        kwargs.setdefault("timeout", self.settings.timeout_s)
        try:
            return self._invoke(method, args, kwargs)
        except (MilvusException, grpc.RpcError) as exc:  # pymilvus lets a call's DEADLINE_EXCEEDED out raw
            if is_grpc_deadline(exc):
                limit = milvus_bound(kwargs["timeout"], self.settings)
                raise timed_out("Milvus", f"{method} on {self.name!r}", limit, address=str(self.settings.uri)) from exc
            raise StoreError(f"Milvus {method} on {self.name!r} failed: {exc}") from exc

    def cut(self, timeout: float | None) -> float:
        """A search's timeout: the search timeout, or ``timeout`` when that is shorter."""
        search_timeout = self.settings.search_timeout_s
        return search_timeout if timeout is None else max(0.001, min(timeout, search_timeout))

    def _invoke(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The client call; once more after loading the collection again when the server has it released:
        a restarted server may come back so (a ``milvus-lite server`` always does, as after an operator's
        ``release``), and opening the index is what loaded it."""
        call = getattr(self.client, method)
        try:
            return call(*args, **kwargs)
        except MilvusException as exc:
            if exc.code != _COLLECTION_NOT_LOADED:
                raise
            logger.warning("Milvus collection %s is not loaded (%s): loading it again", self.name, exc.message)
        self.client.load_collection(self.name, replica_number=self.settings.replica_number, timeout=kwargs["timeout"])
        return call(*args, **kwargs)
