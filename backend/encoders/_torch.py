"""Device selection shared by the torch-based encoders."""

from __future__ import annotations


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
    import json
    from pathlib import Path

    config = Path(model) / "config.json"
    if not config.is_file():
        return None
    return int(json.loads(config.read_text(encoding="utf-8")).get("hidden_size") or 0) or None
