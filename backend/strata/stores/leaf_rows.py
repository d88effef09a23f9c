"""How a leaf maps to a row of the Milvus collection, and a search hit back to a leaf (pure)."""

from __future__ import annotations

from typing import Any

import numpy as np

from strata.stores.keys import version_key
from strata.types import LEAF_LEVEL, Chunk, LeafHit, RouteHit

SCALAR_FIELDS = [
    "kb_id",
    "doc_id",
    "version",
    "parent_id",
    "root_id",
    "ordinal",
    "content",
    "heading_path",
    "source",
    "char_start",
    "char_end",
    "metadata",
]


def leaf_row(leaf: Chunk, vector: np.ndarray, search_text: str) -> dict[str, Any]:
    meta = dict(leaf.metadata)
    return {
        "chunk_id": leaf.chunk_id,
        "kb_id": leaf.kb_id,
        "doc_id": leaf.doc_id,
        "version": leaf.version,
        "version_key": version_key(leaf.kb_id, leaf.doc_id, leaf.version),
        "parent_id": leaf.parent_id or "",
        "root_id": leaf.root_id,
        "level": leaf.level,
        "ordinal": leaf.ordinal,
        "heading_path": leaf.heading_path,
        "module": str(meta.get("module") or ""),
        "skill_points": [str(s) for s in meta.get("skill_points") or []],
        "source": str(meta.get("source") or ""),
        "char_start": leaf.char_start,
        "char_end": leaf.char_end,
        "metadata": meta,
        "content": leaf.text,
        "text": search_text,
        "dense": np.asarray(vector, dtype=np.float32).tolist(),
    }


def route_fields(with_source: bool) -> list[str]:
    return ["kb_id", "source"] if with_source else ["kb_id"]


def route_hit(hit: dict[str, Any], score: float) -> RouteHit:
    e = hit["entity"]
    return RouteHit(chunk_id=str(hit["chunk_id"]), kb_id=e["kb_id"], score=float(score), source=e.get("source", ""))


def leaf_hit(hit: dict[str, Any], score: float) -> LeafHit:
    return LeafHit(chunk=leaf_chunk({"chunk_id": hit["chunk_id"], **hit["entity"]}), score=float(score))


def leaf_chunk(e: dict[str, Any]) -> Chunk:
    return Chunk(
        chunk_id=str(e["chunk_id"]),
        kb_id=e["kb_id"],
        doc_id=e["doc_id"],
        version=int(e["version"]),
        level=LEAF_LEVEL,
        parent_id=e["parent_id"] or None,
        root_id=e["root_id"],
        ordinal=int(e["ordinal"]),
        text=e["content"],
        heading_path=e["heading_path"],
        char_start=int(e["char_start"]),
        char_end=int(e["char_end"]),
        metadata=e.get("metadata") or {},
    )
