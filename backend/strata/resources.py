"""The engine's parts, built once from ``Settings`` and shared.

``Resources`` wires the encoder and the three stores that both ``indexing``
and ``rag`` use (rag builds its own reranker and query cache), and the one
``RedisBreaker`` that the parent store and the query cache share. Every part is
created on first use, so building a ``Resources`` opens no connection and
loads no model.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable

from strata.config import Settings
from strata.encoders import Encoder, create_encoder
from strata.stores.catalog import Catalog
from strata.stores.keys import database_namespace
from strata.stores.leaf_index import LeafIndex
from strata.stores.parent_cache import create_parent_cache
from strata.stores.parents import ParentStore
from strata.stores.redis_client import RedisBreaker
from strata.stores.sql import DocumentStore


class Resources:
    """Lazily built encoder, stores and reranker for one ``Settings``."""

    def __init__(self, settings: Settings, *, encoder: Encoder | None = None) -> None:
        self.settings = settings
        self._encoder = encoder
        self._lock = threading.RLock()

    @functools.cached_property
    def encoder(self) -> Encoder:
        with self._lock:
            return self._encoder or create_encoder(self.settings.embedding)

    @functools.cached_property
    def documents(self) -> DocumentStore:
        with self._lock:
            return DocumentStore(self.settings.database)

    @functools.cached_property
    def leaf_index(self) -> LeafIndex:
        return self.open_leaf_index()

    def open_leaf_index(self, extra_terms: Iterable[str] = ()) -> LeafIndex:
        """The leaf index; a collection created now gets the front-matter terms SQL knows, plus
        ``extra_terms`` (those of documents about to be indexed), in its BM25 dictionary."""
        with self._lock:
            if "leaf_index" not in self.__dict__:
                encoder = self.encoder
                terms = lambda kb_ids: [*Catalog(self.documents.engine).vocabulary(kb_ids).terms, *extra_terms]  # noqa: E731
                self.__dict__["leaf_index"] = LeafIndex(
                    self.settings.milvus,
                    encoder_name=encoder.name,
                    dim=encoder.dim,
                    vocabulary=terms,
                    tenants=self.tenants,
                )
            return self.__dict__["leaf_index"]

    @property
    def tenants(self) -> bool:
        """Whether the service has API keys with grants: kbs of teams kept apart (``leaf_index.default_level``)."""
        return bool(self.settings.api.keys or self.settings.api.keys_file)

    @functools.cached_property
    def redis_breaker(self) -> RedisBreaker:
        """Opened by a Redis error of any user (parent store, query cache); all of them skip Redis meanwhile."""
        with self._lock:
            return RedisBreaker.from_settings(self.settings.redis)

    @functools.cached_property
    def parents(self) -> ParentStore:
        with self._lock:
            cache = create_parent_cache(
                self.settings.redis, namespace=database_namespace(str(self.settings.database.url))
            )
            return ParentStore(cache, self.documents, breaker=self.redis_breaker)

    def close(self) -> None:
        """Releases what was opened: Milvus, the SQL pool, the Redis client and an encoder's HTTP client.

        Milvus Lite keeps its file until the process exits or the server is released.
        """
        for name, closer in (
            ("leaf_index", "close"),
            ("documents", "dispose"),
            ("parents", "close"),
            ("encoder", "close"),
        ):
            part = self.__dict__.get(name)
            if part is not None and hasattr(part, closer):
                getattr(part, closer)()
