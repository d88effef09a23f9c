"""Page builder of the ``en-mkdocs`` documentation dev set (eval/docs-dev/en-mkdocs/).

Eleven Markdown (MkDocs, Material theme: ``!!! note`` admonitions, ``???``
collapsible blocks, ``=== "Tab"`` content tabs, fenced code) pages of
Starlette's documentation, copied verbatim (only ``\\r\\n`` -> ``\\n``) from
the ``docs/`` folder of the Starlette 1.10.0 source distribution on PyPI
(BSD-3-Clause, (c) 2018 Encode OSS Ltd). The sdist is fetched with
``pip download --no-deps --no-binary :all: starlette==1.10.0`` and refused
unless its sha256 is the one below, so the build is deterministic.

Starlette's pages have no ``# `` title line (MkDocs takes the title from the
``nav`` of mkdocs.yml), so each page gets one line prepended: ``# `` and its
nav title (``# Middleware``), then a blank line unless the page already
starts with one. Nothing else is changed.

    python scripts/docs_dev_sources/en_mkdocs.py     # writes eval/docs-dev/en-mkdocs/pages/

Standard library only (pip is run as ``python -m pip``).
"""

from __future__ import annotations

import pathlib
import sys
import tarfile
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the builders' shared download
from _pinned import pinned_sdist

PACKAGE = "starlette"
VERSION = "1.10.0"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
SDIST_SHA256 = "b8399098d4c1e3522734f7235dc79b1fc967f96cf139c81e0fa30479e0685f9b"

# path inside the sdist -> page file stem, title (the page's nav title in mkdocs.yml)
PAGES: list[tuple[str, str, str]] = [
    ("docs/middleware.md", "starlette-middleware", "Middleware"),
    ("docs/routing.md", "starlette-routing", "Routing"),
    ("docs/testclient.md", "starlette-testclient", "Test Client"),
    ("docs/responses.md", "starlette-responses", "Responses"),
    ("docs/requests.md", "starlette-requests", "Requests"),
    ("docs/config.md", "starlette-config", "Configuration"),
    ("docs/authentication.md", "starlette-authentication", "Authentication"),
    ("docs/exceptions.md", "starlette-exceptions", "Exceptions"),
    ("docs/websockets.md", "starlette-websockets", "WebSockets"),
    ("docs/templates.md", "starlette-templates", "Templates"),
    ("docs/lifespan.md", "starlette-lifespan", "Lifespan"),
]


def fetch(work_dir: pathlib.Path) -> pathlib.Path:
    """The pinned archive in work_dir (downloaded if absent), its sha256 checked."""
    return pinned_sdist(PACKAGE, VERSION, SDIST, SDIST_SHA256, work_dir)


def with_title(text: str, title: str) -> str:
    """The page with a ``# title`` line prepended unless its first non-blank line is one.

    (Starlette's pages never have one; a ``# `` line further down is a comment in a code block.)
    """
    if text.lstrip("\n").startswith("# "):
        return text
    return f"# {title}\n" + ("" if text.startswith("\n") else "\n") + text


def build(pages_dir: pathlib.Path, work_dir: pathlib.Path) -> None:
    """Download the pinned sdist into work_dir and write the chosen pages into pages_dir."""
    archive = fetch(work_dir)
    pages_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for inner, stem, title in PAGES:
            member = tar.extractfile(f"{PACKAGE}-{VERSION}/{inner}")
            if member is None:
                raise SystemExit(f"{inner} is not a file in {SDIST}")
            text = member.read().decode("utf-8").replace("\r\n", "\n")
            text = with_title(text, title)
            (pages_dir / f"{stem}.md").write_text(text, encoding="utf-8", newline="")
            print(f"en-mkdocs {stem}.md: {len(text)} characters")


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        build(root / "eval" / "docs-dev" / "en-mkdocs" / "pages", pathlib.Path(tmp))
