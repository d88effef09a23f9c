"""The deployment files (deploy/compose.yml, deploy/k8s/, deploy/Dockerfile) against the code they deploy.

Every ``STRATA_*`` variable they set is loaded through ``load_settings`` with
that variable in the environment and must land in the field its name points
at, with the value given (a misspelt section or field is either refused by
the settings or silently ignored; both fail here). Every service has a health
check and every image a pinned version. No Docker engine is needed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import pytest
import yaml
from pydantic import SecretStr

from strata.config import ENV_PREFIX, ConfigError, load_settings

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "compose.yml"
K8S = DEPLOY / "k8s"
STATEFUL = ("etcd", "minio", "milvus", "postgres", "redis")

# -- the checker ----------------------------------------------------------------------------------------


def resolve(value: Any) -> str:
    """A compose value with ``${NAME:-default}`` replaced by its default and ``${NAME}``/``${NAME:?...}`` by a probe."""

    def substitute(match: re.Match[str]) -> str:
        return match.group(2) if match.group(1) == ":-" else "probe-secret-value"

    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?:(:-|:\?)([^}]*))?\}", substitute, str(value))


@contextmanager
def _environment(variables: Mapping[str, str], workdir: Path) -> Iterator[None]:
    """Only ``variables`` among STRATA_*, run from an empty folder (no .env, no strata.toml is read)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    cwd = os.getcwd()
    for name in saved:
        del os.environ[name]
    os.environ.update(variables)
    os.environ[f"{ENV_PREFIX}CONFIG"] = str(workdir / "absent.toml")
    os.chdir(workdir)
    try:
        yield
    finally:
        os.chdir(cwd)
        for name in [n for n in os.environ if n.startswith(ENV_PREFIX)]:
            del os.environ[name]
        os.environ.update(saved)


def _lands(loaded: Any, raw: str) -> bool:
    """Whether the loaded field holds what the variable said."""
    if isinstance(loaded, SecretStr):
        loaded = loaded.get_secret_value()
    if isinstance(loaded, bool):
        return raw.strip().lower() in ({"1", "true", "yes", "on"} if loaded else {"0", "false", "no", "off"})
    if isinstance(loaded, (int, float)):
        return float(raw) == float(loaded)
    if isinstance(loaded, (dict, list)):
        return json.loads(raw) == loaded
    if isinstance(loaded, Path):
        return Path(raw) == loaded
    return loaded is not None and str(loaded) == raw


def settings_problems(environment: Mapping[str, str], workdir: Path) -> list[str]:
    """What is wrong with the STRATA_* variables of one container's environment (empty = all are settings)."""
    variables = {k: str(v) for k, v in environment.items() if k.startswith(ENV_PREFIX)}
    with _environment(variables, workdir):
        try:
            settings = load_settings()
        except ConfigError as exc:
            return [f"the settings refuse this environment: {exc}"]
    problems = []
    for name, raw in sorted(variables.items()):
        value: Any = settings
        for part in name[len(ENV_PREFIX) :].lower().split("__"):
            if not hasattr(type(value), "model_fields") or part not in type(value).model_fields:
                problems.append(f"{name} is not a setting (no field {part!r})")
                break
            value = getattr(value, part)
        else:
            if not _lands(value, raw):
                problems.append(f"{name}={raw!r} did not land in its field (got {value!r})")
    return problems


def image_problem(image: str) -> str | None:
    """None when ``image`` names a pinned version (a tag other than latest, or a digest)."""
    if "@sha256:" in image:
        return None
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        return f"{image}: no version tag"
    if tag == "latest":
        return f"{image}: latest is not a version"
    return None


# -- reading the files ----------------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def _environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: resolve(v) for k, v in env.items()}


def _k8s_documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name in {"milvus-values.yaml", "kustomization.yaml"}:
            continue
        docs.extend(d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d)
    return docs


def _workloads(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for d in docs if d["kind"] in {"Deployment", "Job"}}


def _container_environment(
    container: Mapping[str, Any], docs: list[dict[str, Any]], *, filled: bool = True
) -> dict[str, str]:
    """A container's environment: its ConfigMaps and Secrets (envFrom), then its own env entries.

    ``filled``: the Secret's CHANGE_ME placeholders replaced, as the operator must before applying it.
    """
    sources = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"] in {"ConfigMap", "Secret"}}
    env: dict[str, str] = {}
    for ref in container.get("envFrom") or []:
        kind, key = ("ConfigMap", "configMapRef") if "configMapRef" in ref else ("Secret", "secretRef")
        source = sources[(kind, ref[key]["name"])]
        values = {k: str(v) for k, v in (source.get("data") or source.get("stringData") or {}).items()}
        if kind == "Secret" and filled:
            values = {k: v.replace("CHANGE_ME_TO_A_LONG_RANDOM_SECRET", "probe-secret-value").replace("CHANGE_ME", "probe")
                      for k, v in values.items()}  # fmt: skip
        env.update(values)
    env.update({e["name"]: str(e["value"]) for e in container.get("env") or [] if "value" in e})
    return env


def _containers(workload: Mapping[str, Any]) -> list[dict[str, Any]]:
    return workload["spec"]["template"]["spec"]["containers"]


def _dockerfile_env() -> dict[str, str]:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8").replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(dict(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=(\S+)", line)))
    return env


# -- the deployment files -------------------------------------------------------------------------------


def test_compose_sets_only_real_settings(tmp_path: Path) -> None:
    services = _compose()["services"]
    strata_env = _environment_of(services["strata"])
    assert len([k for k in strata_env if k.startswith(ENV_PREFIX)]) >= 8
    for name, service in services.items():
        assert settings_problems(_environment_of(service), tmp_path) == [], name


def test_k8s_manifests_set_only_real_settings(tmp_path: Path) -> None:
    docs = _k8s_documents()
    workloads = _workloads(docs)
    assert {"Deployment/strata", "Job/strata-index-docs"} <= set(workloads)
    for name, workload in workloads.items():
        for container in _containers(workload):
            env = _container_environment(container, docs)
            assert len([k for k in env if k.startswith(ENV_PREFIX)]) >= 8, name
            assert settings_problems(env, tmp_path) == [], name


def test_the_k8s_secret_as_shipped_is_refused_until_its_placeholders_are_replaced(tmp_path: Path) -> None:
    docs = _k8s_documents()
    (container,) = _containers(_workloads(docs)["Deployment/strata"])
    problems = settings_problems(_container_environment(container, docs, filled=False), tmp_path)
    assert len(problems) == 1 and "STRATA_API__API_KEY must be set to a real secret" in problems[0]


def test_production_env_sets_only_real_settings(tmp_path: Path) -> None:
    lines = (DEPLOY / "production.env").read_text(encoding="utf-8").splitlines()
    env = dict(line.split("=", 1) for line in lines if line.strip() and not line.startswith("#"))
    env = {k: v.replace("CHANGE_ME_TO_A_LONG_RANDOM_SECRET", "probe-secret-value").replace("CHANGE_ME", "probe") for k, v in env.items()}
    assert len(env) >= 10
    assert settings_problems(env, tmp_path) == []


def test_the_image_sets_only_real_settings(tmp_path: Path) -> None:
    env = _dockerfile_env()
    assert "STRATA_DATA_DIR" in env
    assert settings_problems(env, tmp_path) == []


def test_every_compose_service_has_a_health_check_and_the_service_waits_for_its_stores() -> None:
    compose = _compose()
    services = compose["services"]
    assert {"etcd", "minio", "milvus", "postgres", "redis", "strata", "embeddings", "reranker"} <= set(services)
    for name, service in services.items():
        check = service.get("healthcheck") or {}
        assert check.get("test") and not check.get("disable"), f"{name} has no health check"
    assert "/health" in json.dumps(services["strata"]["healthcheck"]["test"])
    for store in ("milvus", "postgres", "redis"):
        assert services["strata"]["depends_on"][store]["condition"] == "service_healthy"
    assert services["embeddings"]["profiles"] == ["embeddings"] and services["reranker"]["profiles"] == ["rerank"]


def test_every_stateful_compose_service_keeps_its_data_in_a_named_volume() -> None:
    compose = _compose()
    for name in STATEFUL:
        mounts = [str(m).split(":", 1)[0] for m in compose["services"][name].get("volumes") or []]
        assert any(m in compose["volumes"] for m in mounts), f"{name} has no named volume"


def test_the_k8s_deployment_probes_ready_and_health_and_is_autoscaled() -> None:
    docs = _k8s_documents()
    (container,) = _containers(_workloads(docs)["Deployment/strata"])
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "/ready" in json.dumps(container["readinessProbe"])
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("Service", "strata"), ("ConfigMap", "strata-settings"), ("Secret", "strata-secrets"),
            ("HorizontalPodAutoscaler", "strata")} <= kinds  # fmt: skip
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "strata"


def test_the_milvus_helm_values_run_a_pinned_cluster() -> None:
    values = yaml.safe_load((K8S / "milvus-values.yaml").read_text(encoding="utf-8"))
    assert values["cluster"]["enabled"] is True
    image = values["image"]["all"]
    assert image_problem(f"{image['repository']}:{image['tag']}") is None
    assert values["queryNode"]["replicas"] >= 2 and values["etcd"]["replicaCount"] >= 3


def test_no_image_is_latest() -> None:
    images = [resolve(s["image"]) for s in _compose()["services"].values()]
    images += [c["image"] for w in _workloads(_k8s_documents()).values() for c in _containers(w)]
    images += re.findall(r"^ARG PYTHON_IMAGE=(\S+)", (DEPLOY / "Dockerfile").read_text(encoding="utf-8"), re.M)
    assert len(images) >= 11
    assert [p for p in map(image_problem, images) if p] == []


def test_the_image_runs_strata_serve_as_a_non_root_user_with_a_health_check() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in {"root", "0"}
    assert re.search(r"^HEALTHCHECK .*\n?.*/health", text, re.M)
    assert re.search(r'^CMD \["strata", "serve", "--host", "0.0.0.0"', text, re.M)
    assert re.search(r"^ARG TORCH_INDEX=cpu", text, re.M)


def _compose_command() -> list[str] | None:
    """``docker compose`` (the v2 plugin) or ``docker-compose`` (v1): both validate a file without an engine."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return ["docker-compose"] if shutil.which("docker-compose") else None


def test_docker_compose_accepts_the_file_with_every_profile(tmp_path: Path) -> None:
    command = _compose_command()
    if command is None:
        pytest.skip("neither `docker compose` nor `docker-compose` is installed: the compose CLI's own check did not run")
    env_file = tmp_path / "compose.env"
    shutil.copy(DEPLOY / "compose.env.example", env_file)
    args = [*command, "--env-file", str(env_file), "-f", str(COMPOSE), "--profile", "embeddings", "--profile", "rerank"]
    done = subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(done.stdout)
    assert set(rendered["services"]) == set(_compose()["services"])
    strata = rendered["services"]["strata"]["environment"]
    assert strata["STRATA_DATABASE__URL"] == "postgresql+psycopg://strata:CHANGE_ME@postgres:5432/strata"

    (tmp_path / "empty.env").write_text("", encoding="utf-8")  # not deploy/.env: an operator's secrets stay unread
    missing = subprocess.run([*command, "--env-file", str(tmp_path / "empty.env"), "-f", str(COMPOSE), "config"],
                             capture_output=True, text=True, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "POSTGRES_PASSWORD"})  # fmt: skip
    assert missing.returncode != 0 and "set POSTGRES_PASSWORD in deploy/.env" in missing.stderr


def test_kustomize_renders_every_manifest_of_the_service() -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed: `kubectl kustomize deploy/k8s` did not run")
    done = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = {(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(done.stdout) if d}
    listed = {(d["kind"], d["metadata"]["name"]) for d in _k8s_documents() if d["kind"] != "Job"}
    assert rendered == listed  # everything but the indexer Job, which is applied on its own


def _setuptools_major() -> int:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("setuptools").split(".")[0])
    except PackageNotFoundError:
        return 0


def test_the_image_install_carries_every_file_of_the_package(tmp_path: Path) -> None:
    """The Dockerfile installs a wheel of pyproject.toml + README + backend/ (no editable install, no git):
    every non-Python file under backend/ (the console's static page) must be in it."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    shutil.copytree(REPO / "backend", source / "backend", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # pyproject's build-system wants setuptools>=77: build with the installed one when it is that recent
    # (no network), else in pip's isolated build environment.
    isolation = [] if _setuptools_major() >= 77 else ["--use-pep517"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *(["--no-build-isolation"] if not isolation else isolation),
         "-q", str(source), "-w", str(tmp_path / "wheel")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    data_files = {str(f.relative_to(source / "backend")) for f in (source / "backend").rglob("*") if f.is_file() and f.suffix != ".py"}
    assert data_files and data_files <= packed, sorted(data_files - packed)


# -- the checker itself ---------------------------------------------------------------------------------


def test_the_checker_fails_on_made_up_setting_names(tmp_path: Path) -> None:
    real = {"STRATA_MILVUS__URI": "http://milvus:19530", "STRATA_API__PORT": "9000", "STRATA_LOG_LEVEL": "DEBUG"}
    assert settings_problems(real, tmp_path) == []

    made_up_field = settings_problems({**real, "STRATA_MILVUS__SHARDS": "4"}, tmp_path)
    made_up_top = settings_problems({**real, "STRATA_MILVUS_URI": "http://other:19530"}, tmp_path)
    made_up_section = settings_problems({**real, "STRATA_VECTORDB__URI": "http://other:19530"}, tmp_path)

    assert len(made_up_field) == 1 and "STRATA_MILVUS__SHARDS" in made_up_field[0]
    assert made_up_top == ["STRATA_MILVUS_URI is not a setting (no field 'milvus_uri')"]
    assert made_up_section == ["STRATA_VECTORDB__URI is not a setting (no field 'vectordb')"]


def test_the_checker_fails_on_a_value_that_does_not_land(tmp_path: Path) -> None:
    problems = settings_problems({"STRATA_EMBEDDING__PROVIDER": "word2vec"}, tmp_path)
    assert len(problems) == 1 and "STRATA_EMBEDDING__PROVIDER" in problems[0]


@pytest.mark.parametrize(
    ("image", "ok"),
    [("redis", False), ("redis:latest", False), ("localhost:5000/strata", False), ("redis:7.4.1-bookworm", True),
     ("localhost:5000/strata:0.1.0", True), ("milvusdb/milvus@sha256:" + "0" * 64, True)],
)  # fmt: skip
def test_the_image_check(image: str, ok: bool) -> None:
    assert (image_problem(image) is None) is ok


def test_compose_interpolation_takes_defaults() -> None:
    assert resolve("${STRATA_ENCODER:-bge-m3}") == "bge-m3"
    assert resolve("postgresql+psycopg://strata:${PW:?set it}@pg/strata") == "postgresql+psycopg://strata:probe-secret-value@pg/strata"
