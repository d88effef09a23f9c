"""Any sentence-transformers model folder (or hub name when online)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import numpy as np

from backend.encoders._torch import resolve_device
from backend.encoders.base import normalized
from backend.errors import EncoderError

logger = logging.getLogger(__name__)


class SentenceTransformerEncoder:
    """A ``sentence_transformers.SentenceTransformer``, loaded on first use."""

    def __init__(self, model: str, *, device: str = "auto", batch_size: int = 32, max_length: int = 512) -> None:
        self._model_name = model
        self._device = device
        self._batch_size = batch_size
        self._max_length = max_length
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"sentence-transformers/{self._model_name.strip('/')}"

    @property
    def dim(self) -> int:
        model = self._loaded()
        # sentence-transformers 5.x renamed get_sentence_embedding_dimension; older releases lack the new name.
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                device = resolve_device(self._device)
                logger.info("loading sentence-transformers model %s on %s", self._model_name, device)
                try:
                    from sentence_transformers import SentenceTransformer

                    self._model = SentenceTransformer(self._model_name, device=device)
                    self._model.max_seq_length = min(self._max_length, self._model.max_seq_length or self._max_length)
                except Exception as exc:
                    raise EncoderError(f"cannot load sentence-transformers model {self._model_name!r}: {exc}") from exc
            return self._model

    def _encode(self, texts: Sequence[str], prompt_name: str) -> np.ndarray:
        model = self._loaded()
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        kwargs: dict[str, Any] = {}
        if prompt_name in (getattr(model, "prompts", None) or {}):
            kwargs["prompt_name"] = prompt_name
        try:
            vectors = model.encode(list(texts), batch_size=self._batch_size, convert_to_numpy=True, **kwargs)
        except Exception as exc:
            raise EncoderError(f"sentence-transformers encoding failed: {exc}") from exc
        return normalized(vectors)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, "query")

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, "passage")
