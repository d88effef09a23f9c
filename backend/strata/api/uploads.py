"""Uploaded files: safe relative names, written under a temporary folder."""

from __future__ import annotations

import shutil
import unicodedata
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

from fastapi import UploadFile

from strata.api.problems import Problem
from strata.stores.catalog import DocumentEntry

_CHUNK = 1024 * 1024
MAX_NAME_CHARS = 1024


def check_name(name: str) -> None:
    if len(name) > MAX_NAME_CHARS or any(unicodedata.category(ch) in ("Cc", "Cs") for ch in name):
        raise Problem(422, "names must be at most 1024 characters without control characters", title="Invalid Input")


def relative_name(filename: str | None) -> PurePosixPath:
    """The upload's name as a relative path inside the upload folder (no ``..``, no absolute paths)."""
    check_name(filename or "")
    parts = [p for p in PurePosixPath((filename or "").replace("\\", "/")).parts if p not in ("/", ".")]
    if not parts or ".." in parts:
        raise Problem(422, f"unusable file name {filename!r}: give a relative path without '..'", title="Invalid Input")
    return PurePosixPath(*parts)


def save_all(files: Sequence[UploadFile], folder: Path) -> None:
    """Writes every upload under ``folder`` by its relative name; duplicate names are refused (blocking I/O)."""
    seen: set[PurePosixPath] = set()
    for upload in files:
        name = relative_name(upload.filename)
        if name in seen:
            raise Problem(422, f"the file {str(name)!r} was sent twice", title="Invalid Input")
        seen.add(name)
        target = folder.joinpath(*name.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        upload.file.seek(0)
        with target.open("wb") as out:
            shutil.copyfileobj(upload.file, out, _CHUNK)


def entry_dict(entry: DocumentEntry) -> dict[str, Any]:
    return {
        "doc_id": entry.doc_id, "version": entry.version, "source": entry.source, "leaf_count": entry.leaf_count,
        "chunk_count": entry.chunk_count, "metadata": dict(entry.metadata),
        "updated_at": entry.updated_at.isoformat() if entry.updated_at else None,
    }  # fmt: skip
