"""Retrieval: hybrid search, two-round auto-merge, rerank with fallback, and the meta record.

The public surface is ``retrieve_documents`` (and ``Retriever`` for callers
that manage their own ``Resources``) plus the formatting helpers.
"""

from backend.rag.format import format_for_context, format_for_tool_output
from backend.rag.retrieve import Retriever, get_retriever, retrieve_documents

__all__ = ["Retriever", "format_for_context", "format_for_tool_output", "get_retriever", "retrieve_documents"]
