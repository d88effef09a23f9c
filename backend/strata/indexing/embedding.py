"""Leaf vectors for indexing: the search text of a leaf and the embedding cache.

A leaf text a kb encoded once (keyed by kb, encoder name and SHA-256 of the
text) is never encoded again for that kb: across versions, ``--recreate`` and
``strata rebuild``. Another kb encodes it anew: what one kb's upload reports
(or how long it takes) never depends on another kb's texts.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from strata.encoders import Encoder
from strata.indexing.report import Progress
from strata.stores.sql import DocumentStore
from strata.types import Chunk

if TYPE_CHECKING:
    from strata.resources import Resources
    from strata.stores.milvus import LeafIndex


def search_text(leaf: Chunk, contextualize: bool) -> str:
    """What BM25 and the encoder see: the leaf, prefixed by its heading path."""
    if contextualize and leaf.heading_path:
        return f"{leaf.heading_path}\n{leaf.text}"
    return leaf.text


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Embedded:
    vectors: np.ndarray
    encoded: int
    reused: int
    seconds: float


def embed_texts(
    texts: list[str], *, kb_id: str, encoder: Encoder, store: DocumentStore, batch_size: int, progress: Progress,
    batch_cached: Callable[[], None] = lambda: None,
) -> Embedded:  # fmt: skip
    """Vectors for ``texts`` of ``kb_id``: the kb's embedding cache first, the encoder (in batches) for the rest.

    Each encoder batch is cached before the next one is encoded (then ``batch_cached`` is called): a run
    killed while encoding loses at most the batch in flight."""
    hashes = [text_hash(t) for t in texts]
    cached = store.cached_embeddings(kb_id, encoder.name, hashes)
    missing = list(dict.fromkeys(h for h in hashes if h not in cached))
    by_hash = dict(zip(hashes, texts))
    fresh: dict[str, np.ndarray] = {}
    started = time.perf_counter()
    for start in range(0, len(missing), batch_size):
        batch = missing[start : start + batch_size]
        encoded = dict(zip(batch, encoder.encode_passages([by_hash[h] for h in batch])))
        store.cache_embeddings(kb_id, encoder.name, encoded)
        fresh.update(encoded)
        progress.leaves_encoded(len(batch))
        batch_cached()
    seconds = time.perf_counter() - started
    if len(missing) < len(texts):
        progress.leaves_encoded(len(texts) - len(missing))
    found = {**cached, **fresh}
    vectors = np.vstack([found[h] for h in hashes]) if hashes else np.zeros((0, encoder.dim), np.float32)
    return Embedded(vectors=vectors, encoded=len(fresh), reused=len(texts) - len(fresh), seconds=seconds)


def upsert_leaves(
    resources: Resources, index: LeafIndex, kb_id: str, leaves: Sequence[Chunk], *, progress: Progress,
    batch_cached: Callable[[], None] = lambda: None,
) -> Embedded:  # fmt: skip
    """``leaves`` of ``kb_id`` into ``index`` with their search texts and vectors (``embed_texts``): the one
    way indexing, ``strata rebuild`` and ``strata reconcile --repair`` write leaves."""
    settings = resources.settings
    texts = [search_text(leaf, settings.chunking.contextualize) for leaf in leaves]
    embedded = embed_texts(
        texts, kb_id=kb_id, encoder=resources.encoder, store=resources.documents,
        batch_size=settings.embedding.batch_size, progress=progress, batch_cached=batch_cached,
    )  # fmt: skip
    resources.documents.check_fences()  # a run whose lease was taken while it encoded writes no leaf
    index.upsert(leaves, embedded.vectors, texts)
    return embedded
