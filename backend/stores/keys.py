"""Deterministic keys shared by the stores."""

from __future__ import annotations

import hashlib


def version_key(kb_id: str, doc_id: str, version: int) -> str:
    """A short key naming one document version (used to hide non-active versions)."""
    return hashlib.sha1(f"{kb_id}\x1f{doc_id}\x1f{version}".encode()).hexdigest()[:24]


def partition_name(kb_id: str) -> str:
    """A valid Milvus partition name for any kb id."""
    return "kb_" + hashlib.sha1(kb_id.encode()).hexdigest()[:20]
