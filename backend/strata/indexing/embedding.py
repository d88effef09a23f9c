"""Leaf vectors for indexing: the search text of a leaf and the embedding cache.

A leaf text a kb encoded once (keyed by kb, encoder name and SHA-256 of the
text) is never encoded again for that kb: across versions, ``--recreate`` and
``strata rebuild``. Another kb encodes it anew: what one kb's upload reports
(or how long it takes) never depends on another kb's texts.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from strata.encoders import Encoder
from strata.indexing.report import Progress
from strata.types import Chunk

if TYPE_CHECKING:
    from strata.resources import Resources
    from strata.stores.leaf_index import LeafIndex


class VectorCache(Protocol):
    """What encoding asks of the kb's embedding cache (``DocumentStore.embeddings``)."""

    def cached_embeddings(self, kb_id: str, encoder: str, text_hashes: Sequence[str]) -> dict[str, np.ndarray]: ...

    def cache_embeddings(self, kb_id: str, encoder: str, vectors: Mapping[str, np.ndarray]) -> None: ...


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
    kept: int = 0  # leaves the index held already, with these vectors (``upsert_leaves(keep_present=True)``)


def embed_texts(
    texts: list[str],
    *,
    kb_id: str,
    encoder: Encoder,
    cache: VectorCache,
    batch_size: int,
    progress: Progress,
    batch_cached: Callable[[], None] = lambda: None,
) -> Embedded:
    """Vectors for ``texts`` of ``kb_id``: the kb's embedding cache first, the encoder (in batches) for the rest.

    Each encoder batch is cached before the next one is encoded (then ``batch_cached`` is called): a run
    killed while encoding loses at most the batch in flight."""
    hashes = [text_hash(t) for t in texts]
    cached = cache.cached_embeddings(kb_id, encoder.name, hashes)
    missing = list(dict.fromkeys(h for h in hashes if h not in cached))
    by_hash = dict(zip(hashes, texts))
    fresh: dict[str, np.ndarray] = {}
    started = time.perf_counter()
    for start in range(0, len(missing), batch_size):
        batch = missing[start : start + batch_size]
        encoded = dict(zip(batch, encoder.encode_passages([by_hash[h] for h in batch])))
        cache.cache_embeddings(kb_id, encoder.name, encoded)
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
    resources: Resources,
    index: LeafIndex,
    kb_id: str,
    leaves: Sequence[Chunk],
    *,
    progress: Progress,
    batch_cached: Callable[[], None] = lambda: None,
    keep_present: bool = False,
) -> Embedded:
    """``leaves`` of ``kb_id`` into ``index`` with their search texts and vectors (``embed_texts``): the one
    way indexing, ``strata rebuild`` and ``strata reconcile --repair`` write leaves.

    ``keep_present`` (a resumed pending version, whose ids and texts are this run's): leaves the index holds
    already are not written again, once one of them is seen to carry the vector this run computed (a run
    with another encoder, a ``--recreate`` that stopped, wrote other vectors: then every leaf is written)."""
    settings = resources.settings
    texts = [search_text(leaf, settings.chunking.contextualize) for leaf in leaves]
    embedded = embed_texts(
        texts,
        kb_id=kb_id,
        encoder=resources.encoder,
        cache=resources.documents.embeddings,
        batch_size=settings.embedding.batch_size,
        progress=progress,
        batch_cached=batch_cached,
    )
    resources.documents.check_fences()  # a run whose lease was taken while it encoded writes no leaf
    present = _present_with_same_vectors(index, kb_id, leaves, embedded.vectors) if keep_present else set()
    if not present:
        index.upsert(leaves, embedded.vectors, texts)
        return embedded
    missing = [i for i, leaf in enumerate(leaves) if leaf.chunk_id not in present]
    index.upsert([leaves[i] for i in missing], embedded.vectors[missing], [texts[i] for i in missing])
    return replace(embedded, kept=len(leaves) - len(missing))


def _present_with_same_vectors(index: LeafIndex, kb_id: str, leaves: Sequence[Chunk], vectors: np.ndarray) -> set[str]:
    """The ids of ``leaves`` the index holds, when the first of them holds the vector computed now; else none."""
    present = index.present(kb_id, [leaf.chunk_id for leaf in leaves])
    if not present:
        return set()
    row = next(i for i, leaf in enumerate(leaves) if leaf.chunk_id in present)
    stored = index.dense_vectors(kb_id, [leaves[row].chunk_id]).get(leaves[row].chunk_id)
    if stored is None or stored.shape != vectors[row].shape or not np.allclose(stored, vectors[row], atol=1e-5):
        return set()
    return present
