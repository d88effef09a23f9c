"""The engine's parts, built once from ``Settings`` and shared.

``Resources`` wires the encoder and the three stores (and the optional
reranker) that both ``indexing`` and ``rag`` use. Every part is created on
first use, so building a ``Resources`` opens no connection and loads no model.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from backend.config import Settings
from backend.encoders import Encoder, create_encoder
from backend.stores.cache import create_parent_cache
from backend.stores.milvus import LeafIndex
from backend.stores.parents import ParentStore
from backend.stores.sql import DocumentStore


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
        with self._lock:
            encoder = self.encoder
            return LeafIndex(self.settings.milvus, encoder_name=encoder.name, dim=encoder.dim)

    @functools.cached_property
    def parents(self) -> ParentStore:
        with self._lock:
            return ParentStore(create_parent_cache(self.settings.redis), self.documents)

    @functools.cached_property
    def reranker(self) -> Any:
        """The configured ``Reranker`` or None when ``STRATA_RERANK__URL`` is unset."""
        from backend.rag.rerank import build_reranker

        with self._lock:
            return build_reranker(self.settings.rerank)

    def close(self) -> None:
        """Releases connections that were opened (Milvus Lite keeps its file until exit)."""
        for name, closer in (("leaf_index", "close"), ("documents", "dispose"), ("reranker", "close")):
            part = self.__dict__.get(name)
            if part is not None:
                getattr(part, closer)()
