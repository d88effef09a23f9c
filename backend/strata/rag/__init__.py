"""Retrieval: hybrid search, two-round auto-merge, rerank with fallback, and the meta record.

The public surface is ``retrieve_documents`` (and ``Retriever`` for callers
that manage their own ``Resources``), the formatting helpers, the strategies
and the retriever registry (``get_retriever(name, **config)``; strata's own
strategies are registered there like a user's), and the pure utilities
``reciprocal_rank_fusion`` and ``merge_adjacent_chunks``. The process's
engine of a configuration (the ``Retriever`` ``retrieve_documents`` uses) is
``strata.rag.retrieve.default_engine``.
"""

from strata.rag.adjacent import merge_adjacent_chunks
from strata.rag.format import format_for_context, format_for_tool_output
from strata.rag.rank_fusion import fuse_candidates, fuse_documents, reciprocal_rank_fusion
from strata.rag.registry import (
    RetrieverProtocol,
    available_retrievers,
    get_retriever,
    register_retriever,
    retrieve_fused,
)
from strata.rag.retrieve import Retriever, retrieve_documents
from strata.strategy_table import STRATEGY_NAMES as STRATEGIES

__all__ = [
    "STRATEGIES",
    "Retriever",
    "RetrieverProtocol",
    "available_retrievers",
    "format_for_context",
    "format_for_tool_output",
    "fuse_candidates",
    "fuse_documents",
    "get_retriever",
    "merge_adjacent_chunks",
    "reciprocal_rank_fusion",
    "register_retriever",
    "retrieve_documents",
    "retrieve_fused",
]
