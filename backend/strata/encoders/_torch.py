"""What the torch-based encoders share: device choice and lazy, thread-safe loading."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from strata.errors import EncoderError

logger = logging.getLogger(__name__)


def resolve_device(device: str) -> str:
    """``auto`` means CUDA when torch sees a GPU, else CPU."""
    if device != "auto":
        return device
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def model_dim_from_config(model: str) -> int | None:
    """hidden_size of a local Hugging Face folder, read without loading weights."""
    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    return int(json.loads(config.read_text(encoding="utf-8")).get("hidden_size") or 0) or None


class LazyModelEncoder:
    """A model folder or hub name, loaded on first use (never at import or construction)."""

    provider = ""

    def __init__(self, model: str, *, device: str = "auto", batch_size: int = 32, max_length: int = 512) -> None:
        self._model_name = model
        self._device = device
        self._batch_size = batch_size
        self._max_length = max_length
        self._model: Any = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"{self.provider}/{self._model_name.strip('/')}"

    def _load(self, device: str) -> Any:
        raise NotImplementedError

    def _loaded(self) -> Any:
        with self._lock:
            if self._model is None:
                device = resolve_device(self._device)
                logger.info("loading %s model %s on %s", self.provider, self._model_name, device)
                try:
                    self._model = self._load(device)
                except Exception as exc:
                    raise EncoderError(f"cannot load {self.provider} model {self._model_name!r}: {exc}") from exc
            return self._model
