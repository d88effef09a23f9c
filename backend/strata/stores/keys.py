"""Deterministic keys shared by the stores."""

from __future__ import annotations

import hashlib

from sqlalchemy.engine import make_url


def version_key(kb_id: str, doc_id: str, version: int) -> str:
    """A short key naming one document version (used to hide non-active versions)."""
    return hashlib.sha1(f"{kb_id}\x1f{doc_id}\x1f{version}".encode()).hexdigest()[:24]


def partition_name(kb_id: str) -> str:
    """A valid Milvus partition name for any kb id."""
    return "kb_" + hashlib.sha1(kb_id.encode()).hexdigest()[:20]


def database_identity(url: str) -> str:
    """A SQL database's URL without its password: what tells two databases apart."""
    return make_url(str(url)).render_as_string(hide_password=True)


def database_namespace(url: str) -> str:
    """A short tag of ``database_identity``: the parent cache's key namespace, so deployments
    sharing a Redis never read each other's chunks."""
    return "db" + hashlib.sha1(database_identity(url).encode("utf-8")).hexdigest()[:10]
