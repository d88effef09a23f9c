"""strata: a Milvus-backed hierarchical RAG retrieval engine.

The library's call is ``from strata import retrieve_documents``; ``Retriever``
serves callers that manage their own ``Resources``. Both are imported on first
use (PEP 562), so ``import strata.config`` (the CLI's first step) does not pay
for the engine's imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strata.rag.retrieve import Retriever, retrieve_documents

__all__ = ["Retriever", "retrieve_documents"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from strata.rag import retrieve

        return getattr(retrieve, name)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")
