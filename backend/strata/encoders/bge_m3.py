"""BGE-M3 through FlagEmbedding's ``BGEM3FlagModel`` (dense vectors)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from strata.encoders._torch import LazyModelEncoder, model_dim_from_config
from strata.encoders.base import normalized
from strata.errors import EncoderError


class BGEM3Encoder(LazyModelEncoder):
    """``BAAI/bge-m3`` or any local folder ``BGEM3FlagModel`` can load; fp16 on CUDA, fp32 on CPU."""

    provider = "bge-m3"

    def __init__(self, model: str, *, device: str = "auto", batch_size: int = 32, max_length: int = 512) -> None:
        super().__init__(model, device=device, batch_size=batch_size, max_length=max_length)
        self._dim: int | None = model_dim_from_config(model)

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._loaded().model.model.config.hidden_size)
        return self._dim

    def _load(self, device: str) -> Any:
        from FlagEmbedding import BGEM3FlagModel

        return BGEM3FlagModel(
            self._model_name,
            use_fp16=device.startswith("cuda"),
            devices=device,
            batch_size=self._batch_size,
            query_max_length=self._max_length,
            passage_max_length=self._max_length,
        )

    def _encode(self, texts: Sequence[str], method: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        model = self._loaded()
        try:
            out = getattr(model, method)(
                list(texts),
                batch_size=self._batch_size,
                max_length=self._max_length,
                return_dense=True,
                return_sparse=False,
                return_colbert_vecs=False,
            )
        except Exception as exc:
            raise EncoderError(f"BGE-M3 encoding failed: {exc}") from exc
        return normalized(out["dense_vecs"])

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, "encode_queries")

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts, "encode_corpus")
