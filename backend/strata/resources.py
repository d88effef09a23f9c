"""The engine's parts, built once from ``Settings`` and shared.

``Resources`` wires the encoder and the three stores that both ``indexing``
and ``rag`` use (rag builds its own reranker and query cache), and the one
``RedisBreaker`` that the chunk cache and the query cache share. Every part is
created on first use, so building a ``Resources`` opens no connection and
loads no model.

Each part is a read-only property over an attribute that stays None until the
part is built; the build holds the lock, so concurrent first uses build it once.
Parts are given at construction, never assigned afterwards: a part given
(``Resources(settings, leaf_index=index)``: a store another ``Resources``
opened, or a wrapper over one that injects a fault) is used as it is.
``close`` releases every part, built or given: a ``Resources`` owns what it is
given, so of two that share a part only one is closed.
"""

from __future__ import annotations

import threading

from strata.config import Settings
from strata.encoders import Encoder, create_encoder
from strata.stores.catalog import Catalog
from strata.stores.chunk_cache import create_chunk_cache
from strata.stores.chunk_reads import CachedChunks
from strata.stores.keys import database_namespace
from strata.stores.leaf_index import LeafIndex
from strata.stores.redis_client import RedisBreaker
from strata.stores.sql import DocumentStore


class Resources:
    """Lazily built encoder, stores and Redis breaker for one ``Settings``."""

    def __init__(
        self,
        settings: Settings,
        *,
        encoder: Encoder | None = None,
        documents: DocumentStore | None = None,
        leaf_index: LeafIndex | None = None,
        cached_chunks: CachedChunks | None = None,
    ) -> None:
        """Each part given is used instead of building the configured one, and closed by ``close``."""
        self.settings = settings
        self._lock = threading.RLock()  # re-entrant: a part's build uses the parts it needs
        self._given_encoder = encoder
        self._encoder: Encoder | None = None
        self._documents = documents
        self._leaf_index = leaf_index
        self._redis_breaker: RedisBreaker | None = None
        self._cached_chunks = cached_chunks

    @property
    def encoder(self) -> Encoder:
        if self._encoder is None:
            with self._lock:
                if self._encoder is None:
                    self._encoder = self._given_encoder or create_encoder(self.settings.embedding)
        return self._encoder

    @property
    def documents(self) -> DocumentStore:
        """The SQL store: ``documents.kbs``, ``.versions``, ``.chunks``, ``.terms``, ``.embeddings``,
        ``.invalidations``."""
        if self._documents is None:
            with self._lock:
                if self._documents is None:
                    self._documents = DocumentStore(self.settings.database)
        return self._documents

    @property
    def leaf_index(self) -> LeafIndex:
        if self._leaf_index is None:
            return self.open_leaf_index()
        return self._leaf_index

    def open_leaf_index(self) -> LeafIndex:
        """The leaf index, opened on the first call: a Milvus Lite file another process holds raises
        ``IndexLockedError`` here. Opening creates no collection, so it fixes no BM25 dictionary: a collection
        is created with the front-matter terms SQL knows plus those its creator passes (``LeafIndex.open_kb``)."""
        with self._lock:
            if self._leaf_index is None:
                encoder = self.encoder
                self._leaf_index = LeafIndex(
                    self.settings.milvus,
                    encoder_name=encoder.name,
                    dim=encoder.dim,
                    vocabulary=lambda kb_ids: Catalog(self.documents.engine).vocabulary(kb_ids).terms,
                    tenants=self.tenants,
                )
            return self._leaf_index

    @property
    def tenants(self) -> bool:
        """Whether the service has API keys with grants: kbs of teams kept apart (``leaf_index.default_level``)."""
        return bool(self.settings.api.keys or self.settings.api.keys_file)

    @property
    def redis_breaker(self) -> RedisBreaker:
        """Opened by a Redis error of any user (chunk cache, query cache); all of them skip Redis meanwhile."""
        if self._redis_breaker is None:
            with self._lock:
                if self._redis_breaker is None:
                    self._redis_breaker = RedisBreaker.from_settings(self.settings.redis)
        return self._redis_breaker

    @property
    def cached_chunks(self) -> CachedChunks:
        """Chunk texts through the chunk cache (Redis or in-process), SQL for the misses."""
        if self._cached_chunks is None:
            with self._lock:
                if self._cached_chunks is None:
                    cache = create_chunk_cache(
                        self.settings.redis, namespace=database_namespace(str(self.settings.database.url))
                    )
                    self._cached_chunks = CachedChunks(cache, self.documents.chunks, breaker=self.redis_breaker)
        return self._cached_chunks

    def close(self) -> None:
        """Releases what was opened or given: Milvus, the SQL pool, the Redis client and an encoder's HTTP client.

        Milvus Lite keeps its file until the process exits or the server is released.
        """
        for part, closer in (
            (self._leaf_index, "close"),
            (self._documents, "dispose"),
            (self._cached_chunks, "close"),
            (self._encoder, "close"),
        ):
            if part is not None and hasattr(part, closer):
                getattr(part, closer)()
