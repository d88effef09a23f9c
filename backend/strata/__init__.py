"""strata: a Milvus-backed hierarchical RAG retrieval engine.

What a caller needs, from one place::

    from strata import retrieve_documents, Filters          # in-process
    result = retrieve_documents("密码重置链接多久失效？", 3, kb_ids=["demo"], filters=Filters(modules=("auth",)))
    result.docs[0].content, result.meta.status

    from strata import StrataClient, AsyncStrataClient      # a strata service, blocking or awaited
    async with AsyncStrataClient(url, api_key) as client:
        result = await client.retrieve_documents("密码重置链接多久失效？", 3)

- calls: ``retrieve_documents``, ``aretrieve_documents`` (awaitable), ``Retriever`` (over ``Resources`` a
  caller manages);
- records: ``RetrievalRequest`` (what a call asks), ``RetrievalResult``, ``RetrievedDocument``,
  ``RetrievalMeta``, ``Filters``;
- clients: ``StrataClient``, ``AsyncStrataClient``;
- errors: ``StrataError`` (every error strata raises), ``InvalidArgumentError`` (a ``ValueError``),
  ``NotFoundError``, ``ConfigError``, ``ServiceError`` (the service refused or could not be reached).

Every name is imported on first use (PEP 562): ``import strata`` (and ``import strata.config``, the CLI's first
step) loads none of the engine's dependencies (Milvus, PyTorch, the stores' drivers).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strata.client import AsyncStrataClient, StrataClient
    from strata.errors import ConfigError, InvalidArgumentError, NotFoundError, ServiceError, StrataError
    from strata.rag.async_retrieve import aretrieve_documents
    from strata.rag.retrieve import Retriever, retrieve_documents
    from strata.request import RetrievalRequest
    from strata.types import Filters, RetrievalMeta, RetrievalResult, RetrievedDocument

_EXPORTS = {
    "retrieve_documents": "strata.rag.retrieve",
    "aretrieve_documents": "strata.rag.async_retrieve",
    "Retriever": "strata.rag.retrieve",
    "RetrievalRequest": "strata.request",
    "RetrievalResult": "strata.types",
    "RetrievedDocument": "strata.types",
    "RetrievalMeta": "strata.types",
    "Filters": "strata.types",
    "StrataClient": "strata.client",
    "AsyncStrataClient": "strata.client",
    "StrataError": "strata.errors",
    "InvalidArgumentError": "strata.errors",
    "NotFoundError": "strata.errors",
    "ConfigError": "strata.errors",
    "ServiceError": "strata.errors",
}
"""Each public name and the module that defines it."""

__all__ = [
    "AsyncStrataClient",
    "ConfigError",
    "Filters",
    "InvalidArgumentError",
    "NotFoundError",
    "RetrievalMeta",
    "RetrievalRequest",
    "RetrievalResult",
    "RetrievedDocument",
    "Retriever",
    "ServiceError",
    "StrataClient",
    "StrataError",
    "aretrieve_documents",
    "retrieve_documents",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'strata' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
