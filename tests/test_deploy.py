"""The deployment files (deploy/compose.yml, deploy/k8s/, deploy/Dockerfile) against the code they deploy.

Every ``STRATA_*`` variable they set is loaded through ``load_settings`` with
that variable in the environment and must land in the field its name points
at, with the value given (a misspelt section or field is either refused by
the settings or silently ignored; both fail here). Every service has a health
check and every image a pinned version. The versions of docs/deploy.md's
"Supported versions" table hold in every file; the Kubernetes install is checked
statically (credentials, replicas, Secrets, security context) against the chart
keys recorded in deploy/k8s/milvus-chart-keys.txt. No Docker engine, cluster,
network or file outside the repository is needed.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from strata.cli.supervisor import EXIT_BUDGET_S, SUPERVISOR_SLACK_S
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
    if isinstance(loaded, dict) and any(hasattr(v, "model_validate") for v in loaded.values()):  # API keys' grants
        given = json.loads(raw)
        return given.keys() == loaded.keys() and all(type(v).model_validate(given[k]) == v for k, v in loaded.items())
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


def _env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines (kustomize's ``envs`` format): comments and blank lines skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line.strip() and not line.lstrip().startswith("#"))


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))


def _generated_secrets() -> list[dict[str, Any]]:
    """The Secrets of kustomization.yaml's secretGenerator, from the committed ``*.env.example`` of each env file
    (the real env files are git-ignored and hold an operator's secrets: never read here)."""
    secrets = []
    for generator in _kustomization().get("secretGenerator") or []:
        values: dict[str, str] = {}
        for name in generator["envs"]:
            values.update(_env_file(K8S / f"{name}.example"))
        metadata = {"name": generator["name"], "namespace": generator.get("namespace", "strata")}
        secrets.append({"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "stringData": values})
    return secrets


def _manifests(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text(encoding="utf-8")) if d]


def _k8s_documents() -> list[dict[str, Any]]:
    """Every manifest under deploy/k8s and its folders (the Jobs of jobs/*), Helm values and kustomizations aside,
    and the generated Secrets."""
    docs = []
    for path in sorted(K8S.rglob("*.yaml")):
        if path.name not in {"milvus-values.yaml", "kustomization.yaml"}:
            docs.extend(_manifests(str(path.relative_to(K8S))))
    return docs + _generated_secrets()


def _milvus_values() -> dict[str, Any]:
    return yaml.safe_load((K8S / "milvus-values.yaml").read_text(encoding="utf-8"))


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
            values = {
                k: v.replace("CHANGE_ME_TO_A_LONG_RANDOM_SECRET", "probe-secret-value").replace("CHANGE_ME", "probe")
                for k, v in values.items()
            }
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
    env = {
        k: v.replace("CHANGE_ME_TO_A_LONG_RANDOM_SECRET", "probe-secret-value").replace("CHANGE_ME", "probe")
        for k, v in env.items()
    }
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
    one_shot = {
        name
        for s in services.values()
        for name, dep in (s.get("depends_on") or {}).items()
        if dep["condition"] == "service_completed_successfully"
    }
    assert one_shot == {"migrate"}  # it exits: compose waits for its exit code, not its health
    for name, service in services.items():
        check = service.get("healthcheck") or {}
        assert name in one_shot or (check.get("test") and not check.get("disable")), f"{name} has no health check"
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
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}  # no exec, no key header
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {
        ("Service", "strata"),
        ("ConfigMap", "strata-settings"),
        ("Secret", "strata-secrets"),
        ("HorizontalPodAutoscaler", "strata"),
    } <= kinds
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == "strata"


def test_every_probed_path_answers_without_a_key() -> None:
    """A probe cannot read the Secret: each path the kubelet, Docker or compose asks must be a route without a key."""
    from strata.api.deps import needs_key
    from strata.api.routes import health

    (container,) = _containers(_workloads(_k8s_documents())["Deployment/strata"])
    probed = {container[p]["httpGet"]["path"] for p in ("startupProbe", "livenessProbe", "readinessProbe")}
    probed |= set(re.findall(r"127\.0\.0\.1:8080(/\w+)", (DEPLOY / "Dockerfile").read_text(encoding="utf-8")))
    probed |= set(re.findall(r":8080(/\w+)", json.dumps(_compose()["services"]["strata"]["healthcheck"]["test"])))
    keyless = {route.path for route in health.router.routes if not needs_key(route)}
    assert probed == {"/health", "/ready"} and probed <= keyless
    assert "/ready/detail" not in keyless  # the errors and timings stay behind a key


def test_the_milvus_helm_values_run_a_pinned_cluster() -> None:
    values = yaml.safe_load((K8S / "milvus-values.yaml").read_text(encoding="utf-8"))
    assert values["cluster"]["enabled"] is True
    image = values["image"]["all"]
    assert image_problem(f"{image['repository']}:{image['tag']}") is None
    assert values["queryNode"]["replicas"] >= 2 and values["etcd"]["replicaCount"] >= 3


def test_no_image_is_latest() -> None:
    images = [resolve(s["image"]) for s in _compose()["services"].values()]
    (release,) = yaml.safe_load((K8S / "release" / "kustomization.yaml").read_text(encoding="utf-8"))["images"]
    images.append(
        f"{release['newName']}@{release['digest']}"
        if "digest" in release
        else f"{release['newName']}:{release['newTag']}"
    )
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
        pytest.skip(
            "neither `docker compose` nor `docker-compose` is installed: the compose CLI's own check did not run"
        )
    env_file = tmp_path / "compose.env"
    shutil.copy(DEPLOY / "compose.env.example", env_file)
    args = [*command, "--env-file", str(env_file), "-f", str(COMPOSE), "--profile", "embeddings", "--profile", "rerank"]
    refused = subprocess.run(
        [*args, "config"], capture_output=True, text=True, timeout=60
    )  # the example's secrets are empty
    assert refused.returncode != 0 and "set POSTGRES_PASSWORD in deploy/.env" in refused.stderr
    filled = {
        "POSTGRES_PASSWORD": "pg-secret",
        "STRATA_API_KEY": "api-secret-value",
        "MINIO_SECRET_KEY": "minio-secret",
    }
    lines = env_file.read_text(encoding="utf-8").splitlines()
    env_file.write_text(
        "\n".join(f"{line}{filled[line[:-1]]}" if line[:-1] in filled else line for line in lines), encoding="utf-8"
    )
    done = subprocess.run([*args, "config"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = yaml.safe_load(done.stdout)
    assert set(rendered["services"]) == set(_compose()["services"])
    strata = rendered["services"]["strata"]["environment"]
    assert strata["STRATA_DATABASE__URL"] == "postgresql+psycopg://strata:pg-secret@postgres:5432/strata"

    (tmp_path / "empty.env").write_text("", encoding="utf-8")  # not deploy/.env: an operator's secrets stay unread
    missing = subprocess.run(
        [*command, "--env-file", str(tmp_path / "empty.env"), "-f", str(COMPOSE), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "POSTGRES_PASSWORD"},
    )
    assert missing.returncode != 0 and "set POSTGRES_PASSWORD in deploy/.env" in missing.stderr


def test_kustomize_renders_every_manifest_of_the_service(tmp_path: Path) -> None:
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed: `kubectl kustomize deploy/k8s` did not run")
    # A copy with the env files an operator makes from the examples (the repository has none: git-ignored).
    k8s = shutil.copytree(K8S, tmp_path / "k8s", ignore=shutil.ignore_patterns("*.env"))
    for example in k8s.glob("*.env.example"):
        shutil.copy(example, k8s / example.name.removesuffix(".example"))
    done = subprocess.run(["kubectl", "kustomize", str(k8s)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(done.stdout) if d}
    # the jobs/* Jobs and the Prometheus Operator's objects are applied on their own (kustomization.yaml says why)
    listed = {(d["kind"], d["metadata"]["name"]) for name in _kustomization()["resources"] for d in _manifests(name)}
    listed |= {(s["kind"], s["metadata"]["name"]) for s in _generated_secrets()}
    assert set(rendered) == listed and ("Job", "strata-db-upgrade") in listed
    for secret in _generated_secrets():  # fixed names (the chart and the Job name them), every key of the example
        made = rendered[("Secret", secret["metadata"]["name"])]
        assert set(made["data"]) == set(secret["stringData"]) and made["metadata"]["namespace"] == "strata"


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
    # the checks' caches (scripts/check) are a developer's, not the package's
    caches = (".ruff_cache", ".mypy_cache", ".import_linter_cache")
    shutil.copytree(
        REPO / "backend",
        source / "backend",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", *caches),
    )
    # listed before the build, which writes its own metadata (*.egg-info) next to the package
    data_files = {
        str(f.relative_to(source / "backend"))
        for f in (source / "backend").rglob("*")
        if f.is_file() and f.suffix != ".py"
    }
    # pyproject's build-system wants setuptools>=77: build with the installed one when it is that recent
    # (no network), else in pip's isolated build environment.
    isolation = [] if _setuptools_major() >= 77 else ["--use-pep517"]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            *(isolation if isolation else ["--no-build-isolation"]),
            "-q",
            str(source),
            "-w",
            str(tmp_path / "wheel"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    packed = set(zipfile.ZipFile(wheel).namelist())
    assert data_files and data_files <= packed, sorted(data_files - packed)


# -- the supported pairing: client, Lite, server image, Helm chart ----------------------------------------

DOCS = REPO / "docs" / "deploy.md"
MILVUS_COMPONENTS = ("proxy", "mixCoordinator", "queryNode", "dataNode", "streamingNode")


def _matrix() -> dict[str, str]:
    """The row of docs/deploy.md's "Supported versions" table for this strata version: column -> cell."""
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    rows = [
        [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        for line in DOCS.read_text(encoding="utf-8").splitlines()
        if line.startswith("|")
    ]
    header = next(r for r in rows if r[:2] == ["strata", "pymilvus"])
    (row,) = [r for r in rows if r[0] == version]
    return dict(zip(header, row))


def _pins() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    return dict(d.split("==", 1) for d in deps if "==" in d)


def _commands(path: Path, program: str) -> list[str]:
    """Every ``program install|upgrade|rebuild ...`` command of a file: in a Markdown page its ```bash blocks, in a
    YAML file its lines (comments included); continued lines joined."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        text = "\n".join(re.findall(r"^```(?:bash|sh)\n(.*?)^```", text, re.M | re.S))
    text = re.sub(r"\\\n\s*#?\s*", " ", text)  # a backslash continues the command on the next (comment) line
    found = []
    for line in text.splitlines():
        for match in re.finditer(rf"(?:^|[\s;&(`]){program}\s+(?:install|upgrade|rebuild)\b[^\n`&;|#)]*", line):
            found.append(" ".join(match.group(0).strip(" ;&(`").split()))
    return found


def test_the_deployed_milvus_is_the_server_line_of_the_pinned_client() -> None:
    matrix, pins = _matrix(), _pins()
    assert matrix["pymilvus"] == pins["pymilvus"] and matrix["milvus-lite"] == pins["milvus-lite"]
    server = matrix["Milvus server image"]
    # pymilvus's own notes: the 3.0.x client for a Milvus 3.0 server, 2.6.x for 2.6 (the same major.minor).
    line = re.fullmatch(r"milvusdb/milvus:v(\d+\.\d+)\.\d+", server).group(1)
    assert line == ".".join(pins["pymilvus"].split(".")[:2])
    assert _compose()["services"]["milvus"]["image"] == server  # what tests/conftest.py starts
    image = _milvus_values()["image"]["all"]
    assert f"{image['repository']}:{image['tag']}" == server


def test_every_helm_install_pins_the_chart_of_the_matrix() -> None:
    chart = _matrix()["Milvus Helm chart"]
    places = [DOCS, DEPLOY / "README.md", *sorted(K8S.glob("*.yaml"))]
    commands = [(path.name, c) for path in places for c in _commands(path, "helm")]
    assert {name for name, _ in commands} >= {"deploy.md", "README.md", "milvus-values.yaml"}
    unpinned = [(name, c) for name, c in commands if not re.search(rf"--version[ =]{re.escape(chart)}(\s|$)", c)]
    assert unpinned == []


def test_the_command_finder_sees_an_unpinned_install(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nhelm install milvus zilliztech/milvus -n strata \\\n  -f values.yaml\n```\n"
        "(helm upgrade --install x y --version 5.0.27)\n```\nhelm install in prose\n```\n",
        encoding="utf-8",
    )
    assert _commands(page, "helm") == ["helm install milvus zilliztech/milvus -n strata -f values.yaml"]
    values = tmp_path / "values.yaml"
    values.write_text("#   helm upgrade --install x y \\\n#     --version 5.0.27\n", encoding="utf-8")
    assert _commands(values, "helm") == ["helm upgrade --install x y --version 5.0.27"]


def test_the_milvus_values_use_only_keys_the_chart_reads() -> None:
    lines = (K8S / "milvus-chart-keys.txt").read_text(encoding="utf-8").splitlines()
    keys = {line.strip() for line in lines if line.strip() and not line.startswith("#")}

    def paths(node: Any, prefix: str) -> Iterator[str]:
        if f"{prefix}/*" in keys:
            yield f"{prefix}/*"
        elif isinstance(node, dict) and node:
            for name, value in node.items():
                yield from paths(value, f"{prefix}.{name}" if prefix else name)
        else:
            yield prefix

    used = set(paths(_milvus_values(), ""))
    assert used - keys == set()


# -- the cluster install can come up ----------------------------------------------------------------------


def _secret_ref(env: list[dict[str, Any]], name: str) -> tuple[str, str] | None:
    for entry in env or []:
        if entry["name"] == name and "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            return ref["name"], ref["key"]
    return None


def test_milvus_reaches_minio_with_the_credentials_minio_runs_with() -> None:
    values = _milvus_values()
    secret = values["minio"]["existingSecret"]  # read by the MinIO subchart only (keys accesskey, secretkey)
    assert "accessKey" not in values["minio"] and "secretKey" not in values["minio"]  # no second copy to drift
    for component in MILVUS_COMPONENTS:  # Milvus's config takes minio.accessKey/secretKey unless the env says otherwise
        env = values[component]["extraEnv"]
        assert _secret_ref(env, "MINIO_ACCESS_KEY_ID") == (secret, "accesskey"), component
        assert _secret_ref(env, "MINIO_SECRET_ACCESS_KEY") == (secret, "secretkey"), component
    generated = {s["metadata"]["name"]: s["stringData"] for s in _generated_secrets()}
    assert {"accesskey", "secretkey"} <= set(generated[secret])


def test_milvus_auth_is_on_and_only_the_user_job_logs_in_as_root() -> None:
    values = _milvus_values()
    user = yaml.safe_load(values["extraConfigFiles"]["user.yaml"])
    assert user["common"]["security"]["authorizationEnabled"] is True
    refs = {_secret_ref(values[c]["extraEnv"], "COMMON_SECURITY_DEFAULTROOTPASSWORD") for c in MILVUS_COMPONENTS}
    assert len(refs) == 1 and None not in refs
    ((secret, key),) = refs
    generated = {s["metadata"]["name"]: s["stringData"] for s in _generated_secrets()}
    assert generated["strata-secrets"]["STRATA_MILVUS__TOKEN"].split(":")[0] == "strata"  # its own user, not root
    workloads = _workloads(_k8s_documents())
    (job,) = _containers(workloads["Job/strata-milvus-user"])
    assert job["command"] == ["strata", "milvus-user", "create"]
    env = {e["name"]: e for e in job["env"]}
    assert _secret_ref(job["env"], "MILVUS_ROOT_PASSWORD") == (secret, key)
    assert env["MILVUS_ADMIN_TOKEN"]["value"] == "root:$(MILVUS_ROOT_PASSWORD)"  # defined after what it expands
    assert list(env).index("MILVUS_ROOT_PASSWORD") < list(env).index("MILVUS_ADMIN_TOKEN")
    readers = [
        name
        for name, w in workloads.items()
        for c in _containers(w)
        for e in c.get("env") or []
        if (e.get("valueFrom") or {}).get("secretKeyRef", {}).get("key") == key
    ]
    assert readers == ["Job/strata-milvus-user"]


def _make_secrets(directory: Path, **environment: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"STRATA_DATABASE__URL", "STRATA_REDIS__URL", "MIGRATION_DATABASE_URL"}
    }
    return subprocess.run(
        ["sh", str(K8S / "make-secrets.sh"), str(directory)],
        capture_output=True,
        text=True,
        timeout=30,
        env={**env, **environment},
    )


URLS = {
    "STRATA_DATABASE__URL": "postgresql+psycopg://strata_app:pw1@pg:5432/strata",
    "MIGRATION_DATABASE_URL": "postgresql+psycopg://strata:pw2@pg:5432/strata",
    "STRATA_REDIS__URL": "redis://:pw3@redis:6379/0",
}


def test_make_secrets_writes_every_secret_with_a_metrics_only_key(tmp_path: Path) -> None:
    done = _make_secrets(tmp_path, **URLS)
    assert done.returncode == 0, done.stderr
    files = {
        name: _env_file(tmp_path / name)
        for name in ("milvus-credentials.env", "strata-secrets.env", "strata-migration.env", "strata-metrics.env")
    }
    for name, values in files.items():
        assert set(values) == set(_env_file(K8S / f"{name}.example")), name
    milvus, strata = files["milvus-credentials.env"], files["strata-secrets.env"]
    user, password = strata["STRATA_MILVUS__TOKEN"].split(":")
    assert user == "strata" and len(password) >= 32 and password != milvus["rootpassword"]
    assert len(milvus["rootpassword"]) >= 32 and len(milvus["secretkey"]) >= 32  # not Milvus's or MinIO's default
    assert strata["STRATA_DATABASE__URL"] == URLS["STRATA_DATABASE__URL"]
    assert files["strata-migration.env"]["STRATA_DATABASE__URL"] == URLS["MIGRATION_DATABASE_URL"]
    metrics_key = files["strata-metrics.env"]["token"]
    assert metrics_key != strata["STRATA_API__API_KEY"] and len(metrics_key) >= 32
    assert json.loads(strata["STRATA_API__KEYS"]) == {metrics_key: {"metrics": True}}
    again = _make_secrets(tmp_path)  # kept, checked again
    assert again.returncode == 0 and _env_file(tmp_path / "strata-secrets.env") == strata


def test_make_secrets_refuses_placeholders_and_minios_default_naming_the_key(tmp_path: Path) -> None:
    done = _make_secrets(tmp_path)  # no URLs given: written with CHANGE_ME, and refused
    assert done.returncode != 0
    assert "strata-secrets.env: STRATA_DATABASE__URL still holds a CHANGE_ME placeholder" in done.stderr
    assert "strata-migration.env: STRATA_DATABASE__URL still holds a CHANGE_ME placeholder" in done.stderr

    copied = tmp_path / "examples"  # the examples copied as they are, as an operator might
    copied.mkdir()
    for example in K8S.glob("*.env.example"):
        shutil.copy(example, copied / example.name.removesuffix(".example"))
    done = _make_secrets(copied, **URLS)
    assert done.returncode != 0 and "strata-secrets.env: STRATA_API__API_KEY still holds a CHANGE_ME" in done.stderr
    assert "milvus-credentials.env: rootpassword still holds a CHANGE_ME" in done.stderr

    filled = tmp_path / "filled"
    assert _make_secrets(filled.mkdir() or filled, **URLS).returncode == 0
    credentials = (filled / "milvus-credentials.env").read_text(encoding="utf-8")
    (filled / "milvus-credentials.env").write_text(
        credentials.replace("accesskey=strata", "accesskey=minioadmin"), encoding="utf-8"
    )
    done = _make_secrets(filled)
    assert done.returncode != 0 and "milvus-credentials.env: accesskey is MinIO's default minioadmin" in done.stderr


def _previous_release_secrets(directory: Path) -> dict[str, str]:
    """The two files the previous release's make-secrets.sh wrote (root's Milvus token, the tables' owner's URL)."""
    directory.mkdir()
    (directory / "milvus-credentials.env").write_text(
        f"accesskey=strata\nsecretkey={'s' * 48}\nrootpassword={'r' * 48}\n", encoding="utf-8"
    )
    old = {
        "STRATA_API__API_KEY": "k" * 48,
        "STRATA_MILVUS__TOKEN": "root:" + "r" * 48,
        "STRATA_DATABASE__URL": "postgresql+psycopg://strata:owner-pw@pg.example:5432/strata",
        "STRATA_REDIS__URL": "redis://:redis-pw@redis.example:6379/0",
    }
    (directory / "strata-secrets.env").write_text("".join(f"{k}={v}\n" for k, v in old.items()), encoding="utf-8")
    return old


def test_make_secrets_upgrades_the_previous_releases_secrets(tmp_path: Path) -> None:
    old = _previous_release_secrets(tmp_path / "given")
    done = _make_secrets(tmp_path / "given", STRATA_DATABASE__URL=URLS["STRATA_DATABASE__URL"])
    assert done.returncode == 0, done.stderr
    assert "upgraded the previous release's secrets" in done.stdout
    files = {
        name: _env_file(tmp_path / "given" / name)
        for name in ("milvus-credentials.env", "strata-secrets.env", "strata-migration.env", "strata-metrics.env")
    }
    for name, values in files.items():
        assert set(values) == set(_env_file(K8S / f"{name}.example")), name
    strata = files["strata-secrets.env"]
    assert strata["STRATA_API__API_KEY"] == old["STRATA_API__API_KEY"]  # clients keep their key
    assert strata["STRATA_REDIS__URL"] == old["STRATA_REDIS__URL"]
    assert strata["STRATA_DATABASE__URL"] == URLS["STRATA_DATABASE__URL"]  # the pods: the serving role
    assert files["strata-migration.env"]["STRATA_DATABASE__URL"] == old["STRATA_DATABASE__URL"]  # the owner: DDL
    user, password = strata["STRATA_MILVUS__TOKEN"].split(":")
    assert user == "strata" and len(password) >= 32  # no pod logs in as root
    assert json.loads(strata["STRATA_API__KEYS"]) == {files["strata-metrics.env"]["token"]: {"metrics": True}}
    assert _env_file(tmp_path / "given" / "strata-secrets.previous.env") == old

    # without the serving role's URL: written with a placeholder on the owner's host, and refused naming the key
    _previous_release_secrets(tmp_path / "placeholder")
    done = _make_secrets(tmp_path / "placeholder")
    assert done.returncode == 1
    assert "strata-secrets.env: STRATA_DATABASE__URL still holds a CHANGE_ME placeholder: set it" in done.stderr
    serving = _env_file(tmp_path / "placeholder" / "strata-secrets.env")["STRATA_DATABASE__URL"]
    assert serving == "postgresql+psycopg://strata_app:CHANGE_ME@pg.example:5432/strata"
    assert _make_secrets(tmp_path / "placeholder").returncode == 1  # run again: kept and checked, not upgraded twice


def test_the_secrets_come_from_git_ignored_env_files_not_from_a_manifest() -> None:
    kustomization = _kustomization()
    assert not [r for r in kustomization["resources"] if "secret" in r.lower()]  # apply -k would overwrite them
    assert not [
        d
        for path in K8S.glob("*.yaml")
        if path.name != "milvus-values.yaml"
        for d in _manifests(path.name)
        if d.get("kind") == "Secret"
    ]
    assert kustomization["generatorOptions"]["disableNameSuffixHash"] is True  # the chart and the Job name them
    ignored = (K8S / ".gitignore").read_text(encoding="utf-8").split()
    for generator in kustomization["secretGenerator"]:
        for name in generator["envs"]:
            assert any(fnmatch.fnmatch(name, pattern) for pattern in ignored), name
            assert not any(fnmatch.fnmatch(f"{name}.example", pattern) for pattern in ignored), name


def test_secrets_are_in_the_secret_and_settings_in_the_config_map() -> None:
    config = next(d for d in _k8s_documents() if d["kind"] == "ConfigMap")["data"]
    strata = next(s for s in _generated_secrets() if s["metadata"]["name"] == "strata-secrets")["stringData"]
    for name in ("STRATA_REDIS__URL", "STRATA_DATABASE__URL", "STRATA_MILVUS__TOKEN", "STRATA_API__API_KEY"):
        assert name in strata and name not in config, name
    assert not [k for k, v in config.items() if re.search(r"://[^/@\s]*:[^/@\s]*@", str(v))]  # no user:password@


def test_a_query_node_or_streaming_node_can_restart_without_an_outage() -> None:
    values = _milvus_values()
    config = next(d for d in _k8s_documents() if d["kind"] == "ConfigMap")["data"]
    replicas = int(config["STRATA_MILVUS__REPLICA_NUMBER"])
    assert replicas == 2 and values["queryNode"]["replicas"] >= replicas  # one in-memory replica per query node
    assert values["streaming"]["enabled"] is True and values["streamingNode"]["replicas"] >= 2
    assert values["indexNode"]["enabled"] is False  # gone since Milvus 2.6
    assert values["pulsarv3"]["enabled"] is True and values["woodpecker"]["enabled"] is False  # one message queue


def test_the_hpa_owns_the_replica_count_and_a_pdb_keeps_one_pod() -> None:
    docs = _k8s_documents()
    deployment = _workloads(docs)["Deployment/strata"]
    assert "replicas" not in deployment["spec"]  # each apply would reset what the HPA chose
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert 1 <= pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]  # a drain can always move one pod
    assert "pdb.yaml" in _kustomization()["resources"]


def test_compute_threads_follow_the_cpu_request() -> None:
    for name, workload in _workloads(_k8s_documents()).items():
        for container in _containers(workload):
            env = {e["name"]: e for e in container.get("env") or []}
            for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # torch's intra-op pool reads OMP_NUM_THREADS
                field = env[variable]["valueFrom"]["resourceFieldRef"]
                assert field["resource"] == "requests.cpu" and field["containerName"] == container["name"], name
                assert str(field["divisor"]) == "1", name
            assert "cpu" in container["resources"]["requests"], name


def test_the_pod_drains_before_it_stops() -> None:
    deployment = _workloads(_k8s_documents())["Deployment/strata"]
    (container,) = _containers(deployment)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert command[0] == "sleep" and 0 < int(command[1]) <= grace - 10  # the server still has time to stop


def test_every_pod_runs_restricted_with_a_read_only_root() -> None:
    for name, workload in _workloads(_k8s_documents()).items():
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
        for container in _containers(workload):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True, name
            assert context["capabilities"]["drop"] == ["ALL"] and not context["capabilities"].get("add"), name
            mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            for writable in ("/tmp", "/data"):  # jieba's cache and temporary files; STRATA_DATA_DIR
                assert mounts.get(writable) in empty_dirs, (name, writable)


def test_a_service_monitor_scrapes_metrics_with_the_api_key() -> None:
    (monitor,) = _manifests("servicemonitor.yaml")
    service = next(d for d in _k8s_documents() if d["kind"] == "Service")
    assert monitor["kind"] == "ServiceMonitor" and monitor["metadata"]["namespace"] == "strata"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    assert "servicemonitor.yaml" not in _kustomization()["resources"]  # needs the Prometheus Operator's CRDs
    # the metrics-only key: a Secret of its own, never the full-access key, granted /metrics and nothing else
    credentials = endpoint["authorization"]["credentials"]
    secrets = {s["metadata"]["name"]: s["stringData"] for s in _generated_secrets()}
    assert credentials["name"] != "strata-secrets" and credentials["key"] != "STRATA_API__API_KEY"
    token = secrets[credentials["name"]][credentials["key"]]
    assert token != secrets["strata-secrets"]["STRATA_API__API_KEY"]
    from strata.api.auth import KeyRing
    from strata.config import ApiSettings

    ring = KeyRing.from_settings(
        ApiSettings(
            api_key=secrets["strata-secrets"]["STRATA_API__API_KEY"], keys=secrets["strata-secrets"]["STRATA_API__KEYS"]
        )
    )
    scraper = ring.lookup(token)
    assert scraper is not None and scraper.can_read_metrics and not scraper.write and scraper.kbs == frozenset()


def test_the_documented_rebuilds_land_in_the_collection_the_servers_read() -> None:
    from strata.cli import build_parser

    config = next(d for d in _k8s_documents() if d["kind"] == "ConfigMap")["data"]
    served = {
        config["STRATA_MILVUS__COLLECTION"],
        _environment_of(_compose()["services"]["strata"])["STRATA_MILVUS__COLLECTION"],
        _env_file(DEPLOY / "production.env")["STRATA_MILVUS__COLLECTION"],
    }
    assert len(served) == 1
    rebuilds = [c for path in (DOCS, DEPLOY / "README.md") for c in _commands(path, "strata")]
    copies = [build_parser().parse_args(shlex.split(c)[1:]) for c in rebuilds if "--to-uri" in c]
    assert len(copies) >= 2  # the standalone and the cluster step
    # named, and the name the pods read; a restore into a new collection (docs/deploy.md "Backup and
    # restore") says how to point the pods at it
    text = DOCS.read_text(encoding="utf-8")
    restored = {a.collection for a in copies} - served
    assert served <= {a.collection for a in copies}
    assert all(f"`STRATA_MILVUS__COLLECTION` (the ConfigMap) at `{name}`" in text for name in restored), restored


def test_minio_is_checked_with_its_own_client() -> None:
    check = _compose()["services"]["minio"]["healthcheck"]["test"]
    assert check == ["CMD", "mc", "ready", "local"]  # recent MinIO images have no curl


def _dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern that matches the path or one of its parent folders decides."""

    def regex(pattern: str) -> str:
        parts = re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/"))
        table = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        return "".join(table.get(part, re.escape(part)) for part in parts)

    excluded = False
    for raw in patterns:
        negate, pattern = raw.startswith("!"), raw.lstrip("!")
        prefixes = [path] + ["/".join(path.split("/")[:i]) for i in range(1, path.count("/") + 1)]
        if any(re.fullmatch(regex(pattern), p) for p in prefixes):
            excluded = not negate
    return excluded


def test_the_build_context_carries_the_package_and_no_secret_weight_or_history() -> None:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", (DEPLOY / "Dockerfile").read_text(encoding="utf-8"), re.M)
    needed = [name for line in copied for name in line.split()] + ["backend/strata/api/app.py"]
    assert [n for n in needed if _dockerignored(n, patterns)] == []
    unwanted = [
        ".git/config",
        ".venv/bin/python",
        "deploy/.env",
        ".env",
        "deploy/k8s/strata-secrets.env",
        "deploy/models/bge-m3/model.safetensors",
        "data/strata.sqlite3",
        "data/milvus.db",
        "backend/strata/__pycache__/cli.cpython-311.pyc",
        "backend/strata_rag.egg-info/PKG-INFO",
        "tests/test_deploy.py",
    ]
    assert [n for n in unwanted if not _dockerignored(n, patterns)] == []


def test_the_ignore_matcher_follows_dockers_rules() -> None:
    assert _dockerignored("a/b/x.env", ["**/*.env"])
    assert not _dockerignored("a/x.env.example", ["**/*.env", "!**/*.env.example"])
    assert _dockerignored("deploy/models/w.bin", ["deploy/models"])
    assert not _dockerignored("backend/models.py", ["models"])


def test_evaluation_libraries_are_an_extra_the_image_does_not_install() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {re.split(r"[=<>\[; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert names.isdisjoint({"matplotlib", "pandas", "pyarrow"})
    extras = project["optional-dependencies"]
    assert any(d.startswith("matplotlib==") for d in extras["eval"])
    assert f"{project['name']}[eval]" in extras["dev"]  # a developer's install still has them
    top_level = []  # and nothing imports them when a module is imported
    for source in (REPO / "backend").rglob("*.py"):
        for node in ast.parse(source.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            top_level += [(source.name, m) for m in modules if m.split(".")[0] in {"matplotlib", "pandas", "pyarrow"}]
    assert top_level == []


# -- the checker itself ---------------------------------------------------------------------------------


def test_the_checker_fails_on_made_up_setting_names(tmp_path: Path) -> None:
    real = {"STRATA_MILVUS__URI": "http://milvus:19530", "STRATA_API__PORT": "9000", "STRATA_LOG_LEVEL": "DEBUG"}
    assert settings_problems(real, tmp_path) == []

    made_up_field = settings_problems({**real, "STRATA_MILVUS__SHARDS": "4"}, tmp_path)
    made_up_top = settings_problems({**real, "STRATA_MILVUS_URI": "http://other:19530"}, tmp_path)
    made_up_section = settings_problems({**real, "STRATA_VECTORDB__URI": "http://other:19530"}, tmp_path)

    # the settings themselves refuse an unknown STRATA_ variable, naming it and the closest setting
    for problems, name in (
        (made_up_field, "STRATA_MILVUS__SHARDS"),
        (made_up_top, "STRATA_MILVUS_URI"),
        (made_up_section, "STRATA_VECTORDB__URI"),
    ):
        assert len(problems) == 1 and f"unknown setting {name}" in problems[0], problems
    assert "did you mean STRATA_MILVUS__URI?" in made_up_top[0]


def test_the_checker_fails_on_a_value_that_does_not_land(tmp_path: Path) -> None:
    problems = settings_problems({"STRATA_EMBEDDING__PROVIDER": "word2vec"}, tmp_path)
    assert len(problems) == 1 and "STRATA_EMBEDDING__PROVIDER" in problems[0]


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("redis", False),
        ("redis:latest", False),
        ("localhost:5000/strata", False),
        ("redis:7.4.1-bookworm", True),
        ("localhost:5000/strata:0.1.0", True),
        ("milvusdb/milvus@sha256:" + "0" * 64, True),
    ],
)
def test_the_image_check(image: str, ok: bool) -> None:
    assert (image_problem(image) is None) is ok


def test_compose_interpolation_takes_defaults() -> None:
    assert resolve("${STRATA_ENCODER:-bge-m3}") == "bge-m3"
    assert (
        resolve("postgresql+psycopg://strata:${PW:?set it}@pg/strata")
        == "postgresql+psycopg://strata:probe-secret-value@pg/strata"
    )


# -- model weights: filled by one Job, read-only everywhere else (docs/deploy.md, "Model weights") -------------


def _claim_mounts(workload: Mapping[str, Any], claim: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(container, mount) of every mount of ``claim`` in the workload, with the volume's own readOnly merged in."""
    pod = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v.get("persistentVolumeClaim") or {} for v in pod.get("volumes") or []}
    found = []
    for container in _containers(workload):
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"], {})
            if volume.get("claimName") == claim:
                found.append((container, {**mount, "volumeReadOnly": volume.get("readOnly") is True}))
    return found


def test_every_claim_can_be_written_by_someone() -> None:
    """A new ReadOnlyMany claim is an empty volume that nothing can ever fill."""
    claims = [d for d in _manifests("pvc.yaml") if d["kind"] == "PersistentVolumeClaim"]
    assert {c["metadata"]["name"] for c in claims} == {"strata-models", "strata-sources"}
    for claim in claims:
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"], claim["metadata"]["name"]


def test_the_loader_job_is_the_one_writer_of_the_models_and_the_pods_mount_them_read_only() -> None:
    docs = _k8s_documents()
    workloads = _workloads(docs)
    writers, readers = set(), set()
    for name, workload in workloads.items():
        for container, mount in _claim_mounts(workload, "strata-models"):
            read_only = mount.get("readOnly") is True and mount["volumeReadOnly"]
            (readers if read_only else writers).add(name)
            model = _container_environment(container, docs)["STRATA_EMBEDDING__MODEL"]
            assert Path(model).is_relative_to(mount["mountPath"]), (name, model)  # the folder is on the claim
    assert writers == {"Job/strata-model-loader"}
    assert {"Deployment/strata", "Job/strata-index-docs"} <= readers

    (loader,) = _containers(workloads["Job/strata-model-loader"])
    env = _container_environment(loader, docs)
    script = loader["command"][-1]
    assert env["HF_HUB_OFFLINE"] == "0" and _dockerfile_env()["HF_HUB_OFFLINE"] == "1"  # only the loader downloads
    download = next(line for line in script.splitlines() if "hf download" in line)
    assert '--local-dir "$target.partial"' in download and "$MODEL_REPO" in download
    steps = [line.strip() for line in script.splitlines()]
    check = steps.index('STRATA_EMBEDDING__MODEL="$target.partial" python -m strata.encoders.model_folder')
    assert check < steps.index('mv "$target.partial" "$target"')  # loaded before the pods can see it
    assert 'target="$STRATA_EMBEDDING__MODEL"' in steps  # the folder the ConfigMap tells the pods to load
    assert (Path(sys.executable).parent / "hf").exists()  # the image installs the same dependencies: it has `hf`
    assert "model-loader-job.yaml" not in _kustomization()["resources"]  # run on its own, before a rollout
    assert yaml.safe_load((K8S / "jobs" / "model-loader" / "kustomization.yaml").read_text(encoding="utf-8"))[
        "resources"
    ] == ["model-loader-job.yaml"]


def test_the_documented_model_loading_applies_the_loader_job() -> None:
    section = DOCS.read_text(encoding="utf-8").split("## Model weights", 1)[1].split("\n## ", 1)[0]
    commands = "\n".join(re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S))
    assert "kubectl apply -k deploy/k8s/jobs/model-loader" in commands
    assert "job/strata-model-loader" in section and "model folder /models/bge-m3: not found" in section


# after the grace: cancelling what is left, closing the stores, the workers' exit (strata ends itself past it)
SHUTDOWN_MARGIN_S = EXIT_BUDGET_S + SUPERVISOR_SLACK_S


def _seconds(value: str | int) -> float:
    text = str(value)
    return float(text[:-1]) if text.endswith("s") else float(text)


def test_strata_shutdown_fits_in_the_grace_the_orchestrators_give() -> None:
    """The kubelet SIGKILLs a pod terminationGracePeriodSeconds after it starts stopping it (preStop included), and
    Docker a container stop_grace_period after SIGTERM: both must outlast strata's own shutdown."""
    from strata.config import ApiSettings

    default_grace = ApiSettings.model_fields["shutdown_grace_s"].default
    config = next(d for d in _k8s_documents() if d["kind"] == "ConfigMap")["data"]
    grace = float(config.get("STRATA_API__SHUTDOWN_GRACE_S", default_grace))
    pod = next(d for d in _k8s_documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "strata")["spec"][
        "template"
    ]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "strata"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert float(pre_stop[1]) + grace + SHUTDOWN_MARGIN_S <= pod["terminationGracePeriodSeconds"]

    service = _compose()["services"]["strata"]
    compose_grace = float(_environment_of(service).get("STRATA_API__SHUTDOWN_GRACE_S", default_grace))
    assert compose_grace + SHUTDOWN_MARGIN_S <= _seconds(service["stop_grace_period"])


def _strata_ports() -> dict[str, int]:
    """Every place a deploy file (or the settings' default) names the port strata serves on, by where."""
    from strata.config import ApiSettings

    ports = {"config.py default": int(ApiSettings.model_fields["port"].default)}
    ports["production.env"] = int(_env_file(DEPLOY / "production.env")["STRATA_API__PORT"])
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    ports["Dockerfile ENV"] = int(_dockerfile_env()["STRATA_API__PORT"])
    ports |= {f"Dockerfile {what}": int(port) for what, port in re.findall(r"^(EXPOSE) (\d+)", dockerfile, re.M)}
    ports |= {f"Dockerfile CMD {n}": int(p) for n, p in enumerate(re.findall(r'"--port", "(\d+)"', dockerfile))}
    ports |= {f"Dockerfile probe {n}": int(p) for n, p in enumerate(re.findall(r"127\.0\.0\.1:(\d+)", dockerfile))}
    service = _compose()["services"]["strata"]
    ports["compose command"] = int(service["command"][service["command"].index("--port") + 1])
    ports |= {f"compose ports {n}": int(str(mapping).rsplit(":", 1)[1]) for n, mapping in enumerate(service["ports"])}
    probe = json.dumps(service["healthcheck"]["test"])
    ports |= {f"compose probe {n}": int(p) for n, p in enumerate(re.findall(r"127\.0\.0\.1:(\d+)", probe))}
    if "STRATA_API__PORT" in _environment_of(service):
        ports["compose environment"] = int(_environment_of(service)["STRATA_API__PORT"])
    docs = _k8s_documents()
    (container,) = [c for c in _containers(_workloads(docs)["Deployment/strata"]) if c["name"] == "strata"]
    ports["k8s command"] = int(container["command"][container["command"].index("--port") + 1])
    ports |= {f"k8s containerPort {p['name']}": int(p["containerPort"]) for p in container["ports"]}
    if "STRATA_API__PORT" in _container_environment(container, docs):
        ports["k8s environment"] = int(_container_environment(container, docs)["STRATA_API__PORT"])
    return ports


def test_every_deploy_file_serves_strata_on_one_port() -> None:
    ports = _strata_ports()
    assert {"production.env", "Dockerfile EXPOSE", "compose command", "k8s containerPort http"} <= set(ports)
    assert len(set(ports.values())) == 1, ports
