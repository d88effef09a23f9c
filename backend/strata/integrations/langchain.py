"""strata as a LangChain retriever (``pip install 'strata-rag[langchain]'``).

    from strata.integrations.langchain import StrataRetriever

    retriever = StrataRetriever(kb_ids=["demo"], top_k=5)
    docs = retriever.invoke("密码重置链接多久失效？")
    docs[0].metadata["heading_path"], docs[0].metadata["strata_meta"]["status"]

On a strata service, ``StrataRetriever(client=StrataClient(url, key), async_client=AsyncStrataClient(url, key))``:
``invoke`` uses the first, ``ainvoke`` awaits the second (no thread per call). In-process, ``ainvoke`` runs the
engine in strata's query pool (``strata.rag.async_retrieve``).

Each ``Document`` carries strata's metadata (``heading_path``, ``source``,
``level``, ``merged_from``, ``trace``, ``score``, ...) and the call's meta
record under ``META_KEY``; ``on_result`` receives the whole
``RetrievalResult``, which is how an empty result still shows why it is empty.
"""

from __future__ import annotations

from typing import Any

try:
    from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "strata.integrations.langchain needs langchain-core: pip install 'strata-rag[langchain]'"
    ) from exc

from pydantic import Field, field_validator

from strata.client import AsyncStrataClient, StrataClient
from strata.integrations._common import META_KEY, ResultCallback, RetrievalCall, as_filters, document_metadata
from strata.rag.retrieve import Retriever
from strata.types import Filters, RetrievalResult

__all__ = ["META_KEY", "StrataRetriever"]


class StrataRetriever(BaseRetriever):
    """A LangChain ``BaseRetriever`` over a registered strata retriever (by default the configured
    strategy, ``STRATA_RETRIEVAL__STRATEGY``: ``auto_merge`` unless set).

    ``engine`` is the ``strata.rag.retrieve.Retriever`` it runs on, e.g. one of the caller's own
    ``Resources`` or ``default_engine(settings)``; without one, ``default_engine()`` (the
    environment's settings) answers. ``client`` and ``async_client`` answer from a strata service instead
    (``invoke`` and ``ainvoke``; see the module docstring).
    """

    strategy: str | None = None
    kb_ids: list[str] | None = None
    filters: Filters | None = None
    top_k: int = Field(5, ge=1)
    engine: Retriever | None = None
    on_result: ResultCallback | None = None
    client: StrataClient | None = None
    async_client: AsyncStrataClient | None = None

    @field_validator("filters", mode="before")
    @classmethod
    def _filters(cls, value: Any) -> Filters | None:
        return as_filters(value)

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self._documents(query)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        return to_documents(await self._call().arun(query))

    def _documents(self, query: str) -> list[Document]:
        return to_documents(self._call().run(query))

    def _call(self) -> RetrievalCall:
        return RetrievalCall(
            strategy=self.strategy,
            kb_ids=self.kb_ids,
            filters=self.filters,
            top_k=self.top_k,
            engine=self.engine,
            on_result=self.on_result,
            client=self.client,
            async_client=self.async_client,
        )


def to_documents(result: RetrievalResult) -> list[Document]:
    """strata's documents as LangChain ``Document``s (id = chunk id), best first."""
    meta = result.meta.to_dict()
    return [
        Document(page_content=doc.content, metadata=document_metadata(doc, meta), id=doc.metadata.get("chunk_id"))
        for doc in result.docs
    ]
