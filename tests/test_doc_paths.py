"""Every repository path the user's documents and the package's docstrings name exists.

README.md, docs/*.md and the comments and docstrings of backend/strata name files of the repository
(``docs/evaluation.md``, ``deploy/k8s/deployment.yaml``, ``tests/cli/test_milvus_user.py``); a file moved or
renamed without its references leaves a reader at a dead end. Names the user makes (``deploy/.env``, a model
folder) and the objects ``kubectl`` names ``deploy/NAME`` are listed below with why.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("docs", "backend", "tests", "scripts", "deploy", "examples", "eval", ".ci")
# A path starts after a space, quote, bracket or backtick (not inside a URL or a longer path) and stops at a
# character no path of the repository holds.
PATH = re.compile(r"(?<![\w./@:-])((?:{})/[\w.+/-]*)".format("|".join(re.escape(f) for f in TOP_FOLDERS)))
GLOB_OR_TEMPLATE = frozenset("*{<")
# Modules named from inside the package (``stores/sql.py``, ``rag/run_state.py``) are files of backend/strata.
PACKAGE = REPO / "backend" / "strata"
SUBPACKAGES = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_"))
MODULE = re.compile(r"(?<![\w./@:-])((?:{})/[\w/]+\.py)\b".format("|".join(SUBPACKAGES)))
# Capitalised document names (ARCHITECTURE.md, SPEC.md) without a folder: each must be a file of the repository.
DOC_NAME = re.compile(r"\b([A-Z][A-Z_]+\.md)\b")

NOT_IN_THE_REPOSITORY = {
    "deploy/.env": "the operator's copy of deploy/compose.env.example",
    "deploy/k8s/strata-secrets.env": "written by deploy/k8s/make-secrets.sh from its .example",
    "deploy/models": "the folder the weights step downloads into",
    "deploy/models/bge-m3": "downloaded by the weights step",
    "deploy/models/bge-reranker-v2-m3": "downloaded by the weights step",
    "deploy/strata": "kubectl's name of the strata Deployment (`rollout status deploy/strata`)",
    "deploy/milvus-proxy": "kubectl's name of the Milvus chart's proxy Deployment",
}


def _documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "backend").rglob("*.py"))]


def _holds(name: str) -> bool:
    """Whether a file of the repository (not of .venv, .git or another hidden folder) is called ``name``."""
    return any(not any(part.startswith(".") for part in p.relative_to(REPO).parts) for p in REPO.rglob(name))


def named_paths(text: str) -> set[str]:
    """The repository paths ``text`` names, without trailing punctuation; globs and templates are left out."""
    found = set()
    for match in PATH.finditer(text):
        if text[match.end() : match.end() + 1] in GLOB_OR_TEMPLATE:
            continue
        found.add(match.group(1).rstrip(".,;:)/-"))
    return found


def test_named_paths_reads_paths_out_of_prose_and_leaves_urls_and_globs() -> None:
    text = (
        "see `docs/deploy.md`, and docs/evaluation.md §8; https://x.dev/docs/a.md is a URL, "
        "tests/*.py a glob, deploy/k8s/jobs/{a,b} a template, (scripts/bench.py)."
    )
    assert named_paths(text) == {"docs/deploy.md", "docs/evaluation.md", "scripts/bench.py"}


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_document_names_exists(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    missing = sorted(p for p in named_paths(text) if p not in NOT_IN_THE_REPOSITORY and not (REPO / p).exists())
    assert not missing, f"{document.relative_to(REPO)} names files the repository does not hold: {missing}"
    modules = sorted(m.group(1) for m in MODULE.finditer(text) if not (PACKAGE / m.group(1)).exists())
    assert not modules, f"{document.relative_to(REPO)} names modules the package does not hold: {modules}"
    names = {m.group(1) for m in DOC_NAME.finditer(text)}
    absent = sorted(n for n in names if not _holds(n))
    assert not absent, f"{document.relative_to(REPO)} names documents the repository does not hold: {absent}"


def test_the_exceptions_are_not_in_the_repository() -> None:
    """An entry that becomes a file of the repository is checked like every other path."""
    present = sorted(p for p in NOT_IN_THE_REPOSITORY if (REPO / p).exists())
    assert not present
