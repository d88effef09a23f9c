"""BGE-M3 through FlagEmbedding's ``BGEM3FlagModel`` (dense vectors)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Sequence

import numpy as np

from backend.encoders._torch import model_dim_from_config, resolve_device
from backend.encoders.base import normalized
from backend.errors import EncoderError

logger = logging.getLogger(__name__)


class BGEM3Encoder:
    """``BAAI/bge-m3`` or any local folder ``BGEM3FlagModel`` can load.

    Loaded lazily on first use (never at import); fp16 on CUDA, fp32 on CPU.
    """

    def __init__(self, model: str, *, device: str = "auto", batch_size: int = 32, max_length: int = 512) -> None:
        self._model_name = model
        self._device = device
        self._batch_size = batch_size
        self._max_length = max_length
        self._model: Any = None
        self._dim: int | None = model_dim_from_config(model)
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"bge-m3/{self._model_name.strip('/')}"

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self._loaded().model.model.config.hidden_size)
        return self._dim

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                device = resolve_device(self._device)
                logger.info("loading BGE-M3 model %s on %s", self._model_name, device)
                try:
                    from FlagEmbedding import BGEM3FlagModel

                    self._model = BGEM3FlagModel(
                        self._model_name,
                        use_fp16=device.startswith("cuda"),
                        devices=device,
                        batch_size=self._batch_size,
                        query_max_length=self._max_length,
                        passage_max_length=self._max_length,
                    )
                except Exception as exc:
                    raise EncoderError(f"cannot load BGE-M3 model {self._model_name!r}: {exc}") from exc
            return self._model

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
