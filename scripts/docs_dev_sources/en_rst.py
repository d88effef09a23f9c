"""Page builder of the ``en-rst`` documentation dev set (eval/docs-dev/en-rst/).

Twelve reStructuredText (Sphinx) pages of Flask's documentation, copied
verbatim (only ``\\r\\n`` -> ``\\n``) from the ``docs/`` folder of the Flask
3.1.3 source distribution on PyPI (BSD-3-Clause, (c) 2010 Pallets). The sdist
is fetched with ``pip download --no-deps --no-binary :all: flask==3.1.3`` and
refused unless its sha256 is the one below, so the build is deterministic.

    python scripts/docs_dev_sources/en_rst.py     # writes eval/docs-dev/en-rst/pages/

Standard library only (pip is run as ``python -m pip``).
"""

from __future__ import annotations

import pathlib
import sys
import tarfile
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the builders' shared download
from _pinned import pinned_sdist

PACKAGE = "flask"
VERSION = "3.1.3"
SDIST = f"{PACKAGE}-{VERSION}.tar.gz"
SDIST_SHA256 = "0ef0e52b8a9cd932855379197dd8f94047b359ca0a78695144304cb45f87c9eb"

# path inside the sdist's docs/ folder -> page file stem
PAGES: list[tuple[str, str]] = [
    ("docs/config.rst", "flask-config"),
    ("docs/quickstart.rst", "flask-quickstart"),
    ("docs/errorhandling.rst", "flask-errorhandling"),
    ("docs/cli.rst", "flask-cli"),
    ("docs/web-security.rst", "flask-web-security"),
    ("docs/extensiondev.rst", "flask-extensiondev"),
    ("docs/blueprints.rst", "flask-blueprints"),
    ("docs/testing.rst", "flask-testing"),
    ("docs/views.rst", "flask-views"),
    ("docs/reqcontext.rst", "flask-reqcontext"),
    ("docs/templating.rst", "flask-templating"),
    ("docs/design.rst", "flask-design"),
]


def fetch(work_dir: pathlib.Path) -> pathlib.Path:
    """The pinned archive in work_dir (downloaded if absent), its sha256 checked."""
    return pinned_sdist(PACKAGE, VERSION, SDIST, SDIST_SHA256, work_dir)


def build(pages_dir: pathlib.Path, work_dir: pathlib.Path) -> None:
    """Download the pinned sdist into work_dir and write the chosen pages into pages_dir."""
    archive = fetch(work_dir)
    pages_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for inner, stem in PAGES:
            member = tar.extractfile(f"{PACKAGE}-{VERSION}/{inner}")
            if member is None:
                raise SystemExit(f"{inner} is not a file in {SDIST}")
            text = member.read().decode("utf-8").replace("\r\n", "\n")
            (pages_dir / f"{stem}.rst").write_text(text, encoding="utf-8", newline="")
            print(f"en-rst {stem}.rst: {len(text)} characters")


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        build(root / "eval" / "docs-dev" / "en-rst" / "pages", pathlib.Path(tmp))
