"""One Milvus collection of L3 leaves (Milvus Lite file or a Milvus server): ``LeafCollection``.

Opening it (``milvus_setup``) creates or checks the collection; its parts
then share one ``CollectionCalls`` and one ``KbPartitions``: ``writes``
(``milvus_writes``), ``reads`` (``milvus_reads``) and ``searches``
(``milvus_search``). A collection keeps its kbs apart by its layout, read
from its schema and properties:

- ``partition``: a partition per kb. Lite scans every row of the searched
  partitions in Python, and measured on CMRC 2018 leaves a partition-limited
  hybrid search took 14 ms where a ``kb_id`` filter over a 3-kb collection took
  41 ms and no filter 62 ms.
- ``partition_key``: ``kb_id`` is the partition key; a ``kb_id in [...]`` filter prunes.
- ``single``: the collection holds one kb (its ``strata.kb`` property), the
  ``collection`` isolation level of ``strata.stores.leaf_index``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from pymilvus import MilvusClient

from strata.config import MilvusSettings
from strata.stores.lite_engine import LiteEngine
from strata.stores.milvus_calls import CollectionCalls
from strata.stores.milvus_connection import connect
from strata.stores.milvus_partitions import KbPartitions
from strata.stores.milvus_reads import LeafReads
from strata.stores.milvus_search import LeafSearch
from strata.stores.milvus_setup import CollectionSpec, open_collection
from strata.stores.milvus_writes import LeafWrites

logger = logging.getLogger(__name__)


class LeafCollection:
    """The L3 leaves of one collection: its ``writes``, ``reads`` and ``searches``, over the ``calls`` and the
    ``partitions`` they share."""

    def __init__(
        self,
        settings: MilvusSettings,
        *,
        encoder_name: str,
        dim: int,
        vocabulary: Callable[[], Iterable[str]] = lambda: (),
        layout: str | None = None,
        name: str | None = None,
        kb_id: str | None = None,
        client: tuple[MilvusClient, bool] | None = None,
    ) -> None:
        """``vocabulary`` (called only when the collection is created) gives the terms the jieba
        analyzer must keep whole: the modules and skill points of the documents' front-matter.
        ``layout`` (``partition`` or ``partition_key``) is how a collection created now keeps its kbs apart
        (None: ``settings.isolation``'s); with ``kb_id`` the collection ``name`` holds that kb alone
        (``single``). ``client`` is a connection to share (``connect``'s); it stays open at ``close``."""
        name = name or settings.collection
        wanted = layout or settings.isolation
        self._owns_client = client is None
        connection, on_lite = connect(settings) if client is None else client
        self.calls = CollectionCalls(connection, settings, name, on_lite=on_lite)
        engine = LiteEngine(str(settings.uri), name) if settings.is_lite and settings.lite_in_process else None
        spec = CollectionSpec(
            encoder_name=encoder_name,
            dim=dim,
            kb_id=kb_id,
            # for a new collection; an existing one says its own layout
            new_partitions=kb_id is None and (wanted == "partition" or (wanted == "auto" and settings.is_lite)),
            vocabulary=vocabulary,
        )
        opened = open_collection(self.calls, spec)
        self.dictionary = opened.dictionary  # the terms the collection's analyzer keeps whole
        self.partitions = KbPartitions(self.calls, per_kb=opened.layout == "partition", listed=opened.partitions)
        self.writes = LeafWrites(self.calls, self.partitions)
        self.reads = LeafReads(self.calls, self.partitions, kb_id=kb_id)
        self.searches = LeafSearch(self.calls, self.partitions, engine=engine)
        if engine is not None and not engine.available():
            logger.warning(
                "Milvus Lite's engine for %s is not in this process's milvus-lite (another version?): "
                "the route searches go through its gRPC server",
                settings.uri,
            )

    def close(self) -> None:
        if self._owns_client:
            self.calls.client.close()
