"""Any sentence-transformers model folder (or hub name when online)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from strata.encoders._torch import LazyModelEncoder
from strata.encoders.base import normalized
from strata.errors import EncoderError


class SentenceTransformerEncoder(LazyModelEncoder):
    """A ``sentence_transformers.SentenceTransformer``, with its query/passage prompts when it has them."""

    provider = "sentence-transformers"

    @property
    def dim(self) -> int:
        model = self._loaded()
        # sentence-transformers 5.x renamed get_sentence_embedding_dimension; older releases lack the new name.
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    def _load(self, device: str) -> Any:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(self._model_name, device=device)
        model.max_seq_length = min(self._max_length, model.max_seq_length or self._max_length)
        return model

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
