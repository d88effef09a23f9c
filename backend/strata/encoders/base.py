"""The ``Encoder`` protocol every embedding provider honours."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Encoder(Protocol):
    """Turns texts into L2-normalized float32 vectors of ``dim`` dimensions.

    ``name`` identifies the model (provider and model), so a collection built
    with one encoder can refuse another. Queries and passages are separate calls
    because asymmetric models (e5, instruction-tuned models) encode them
    differently. Both return an array of shape ``(len(texts), dim)``.
    """

    @property
    def name(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray: ...


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1.0, norms)
