"""Page builder of the ``zh-rst`` documentation dev set (eval/docs-dev/zh-rst/).

Eight Chinese reStructuredText (Sphinx) pages, copied verbatim (only
``\\r\\n`` -> ``\\n``) from the ``docs/`` folders of three PyPI source
distributions, all MIT-licensed. No single Chinese project ships enough long
rst pages in its sdist, so three are combined:

- ``pywebio`` 1.0.0 (the only PyWebIO sdists that carry ``docs/`` are 1.0.x;
  its docs were still written in Chinese then): guide, spec, index,
  libraries_support.
- ``zhihu-py3`` 0.3.23: examples.
- ``WeRoBot`` 0.6.1 (a zip sdist): replies, messages, handlers.

Each archive is fetched with ``pip download --no-deps --no-binary NAME
NAME==VERSION`` (only the package itself from source; its build tools may be
wheels) and refused unless its sha256 is the one below, so the build is
deterministic.

    python scripts/docs_dev_sources/zh_rst.py     # writes eval/docs-dev/zh-rst/pages/

Standard library only (pip is run as ``python -m pip``).
"""

from __future__ import annotations

import pathlib
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # the builders' shared download
from _pinned import pinned_sdist


@dataclass(frozen=True)
class Source:
    package: str  # the name given to pip
    version: str
    archive: str  # the file pip download writes
    root: str  # the archive's top folder
    sha256: str
    pages: tuple[tuple[str, str], ...]  # (path under root, page stem)


SOURCES: tuple[Source, ...] = (
    Source(
        package="pywebio",
        version="1.0.0",
        archive="pywebio-1.0.0.tar.gz",
        root="pywebio-1.0.0",
        sha256="5eb890aaba7b453531da80391715df13bd532ed7a96076a5294d01654c01659c",
        pages=(
            ("docs/guide.rst", "pywebio-guide"),
            ("docs/spec.rst", "pywebio-spec"),
            ("docs/index.rst", "pywebio-index"),
            ("docs/libraries_support.rst", "pywebio-libraries-support"),
        ),
    ),
    Source(
        package="zhihu-py3",
        version="0.3.23",
        archive="zhihu-py3-0.3.23.tar.gz",
        root="zhihu-py3-0.3.23",
        sha256="2186b8e6f03115e59d963547ac3b04c7a54cef3924467c626094788f703a36af",
        pages=(("docs/examples.rst", "zhihu-py3-examples"),),
    ),
    Source(
        package="werobot",
        version="0.6.1",
        archive="WeRoBot-0.6.1.zip",
        root="WeRoBot-0.6.1",
        sha256="212afae3e95cd70f501caf9c88d7ac21e128ba8130a020f24c7077cde7b4294b",
        pages=(
            ("docs/replies.rst", "werobot-replies"),
            ("docs/messages.rst", "werobot-messages"),
            ("docs/handlers.rst", "werobot-handlers"),
        ),
    ),
)


def fetch(source: Source, work_dir: pathlib.Path) -> pathlib.Path:
    """The pinned archive in work_dir (downloaded if absent), its sha256 checked."""
    return pinned_sdist(
        source.package, source.version, source.archive, source.sha256, work_dir, no_binary=source.package
    )


def read_member(archive: pathlib.Path, name: str) -> bytes:
    """One file of a .tar.gz or .zip archive."""
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            return zf.read(name)
    with tarfile.open(archive) as tar:
        member = tar.extractfile(name)
        if member is None:
            raise SystemExit(f"{name} is not a file in {archive.name}")
        return member.read()


def build(pages_dir: pathlib.Path, work_dir: pathlib.Path) -> None:
    """Download the pinned archives into work_dir and write the chosen pages into pages_dir."""
    pages_dir.mkdir(parents=True, exist_ok=True)
    for source in SOURCES:
        archive = fetch(source, work_dir)
        for inner, stem in source.pages:
            text = read_member(archive, f"{source.root}/{inner}").decode("utf-8").replace("\r\n", "\n")
            (pages_dir / f"{stem}.rst").write_text(text, encoding="utf-8", newline="")
            print(f"zh-rst {stem}.rst: {len(text)} characters")


if __name__ == "__main__":
    root = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp:
        build(root / "eval" / "docs-dev" / "zh-rst" / "pages", pathlib.Path(tmp))
