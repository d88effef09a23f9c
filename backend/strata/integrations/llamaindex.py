"""strata as a LlamaIndex retriever (``pip install 'strata-rag[llamaindex]'``).

    from strata.integrations.llamaindex import StrataRetriever

    retriever = StrataRetriever(kb_ids=["demo"], top_k=5)
    nodes = retriever.retrieve("密码重置链接多久失效？")
    nodes[0].score, nodes[0].node.metadata["heading_path"], nodes[0].node.metadata["strata_meta"]

On a strata service, ``StrataRetriever(client=StrataClient(url, key), async_client=AsyncStrataClient(url, key))``:
``retrieve`` uses the first, ``aretrieve`` awaits the second (no thread per call). In-process, ``aretrieve`` runs
the engine in strata's query pool (``strata.rag.async_retrieve``).

Each ``NodeWithScore`` holds a ``TextNode`` (id = chunk id) with strata's
metadata and the call's meta record under ``META_KEY``. Only ``source`` and
``heading_path`` reach an LLM or embedding prompt; the rest (trace, meta
record, offsets) is excluded there. ``on_result`` receives the whole
``RetrievalResult``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

try:
    from llama_index.core.callbacks import CallbackManager
    from llama_index.core.retrievers import BaseRetriever
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "strata.integrations.llamaindex needs llama-index-core: pip install 'strata-rag[llamaindex]'"
    ) from exc

from strata.client import AsyncStrataClient, StrataClient
from strata.errors import InvalidArgumentError
from strata.integrations._common import META_KEY, ResultCallback, RetrievalCall, as_filters, document_metadata
from strata.rag.retrieve import Retriever
from strata.types import Filters, RetrievalResult

__all__ = ["META_KEY", "StrataRetriever"]

PROMPT_METADATA = ("source", "heading_path")  # what an LLM or embedding prompt sees of a node's metadata


class StrataRetriever(BaseRetriever):
    """A LlamaIndex ``BaseRetriever`` over a registered strata retriever (by default the configured
    strategy, ``STRATA_RETRIEVAL__STRATEGY``: ``auto_merge`` unless set).

    ``engine`` is the ``strata.rag.retrieve.Retriever`` it runs on, e.g. one of the caller's own
    ``Resources`` or ``default_engine(settings)``; without one, ``default_engine()`` (the
    environment's settings) answers. ``client`` and ``async_client`` answer from a strata service instead
    (``retrieve`` and ``aretrieve``; see the module docstring).
    """

    def __init__(
        self,
        *,
        strategy: str | None = None,
        kb_ids: Sequence[str] | None = None,
        filters: Filters | Mapping[str, Any] | None = None,
        top_k: int = 5,
        engine: Retriever | None = None,
        on_result: ResultCallback | None = None,
        client: StrataClient | None = None,
        async_client: AsyncStrataClient | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if top_k < 1:
            raise InvalidArgumentError("top_k must be at least 1")
        super().__init__(callback_manager=callback_manager, verbose=verbose)
        kbs = list(kb_ids) if kb_ids is not None else None
        self.call = RetrievalCall(
            strategy, kbs, as_filters(filters), top_k, engine, on_result, client=client, async_client=async_client
        )

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return to_nodes(self.call.run(query_bundle.query_str))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return to_nodes(await self.call.arun(query_bundle.query_str))


def to_nodes(result: RetrievalResult) -> list[NodeWithScore]:
    """strata's documents as scored LlamaIndex ``TextNode``s, best first."""
    meta = result.meta.to_dict()
    nodes = []
    for doc in result.docs:
        metadata = document_metadata(doc, meta)
        hidden = [key for key in metadata if key not in PROMPT_METADATA]
        identity = {"id_": str(doc.metadata["chunk_id"])} if doc.metadata.get("chunk_id") else {}
        node = TextNode(
            text=doc.content,
            metadata=metadata,
            excluded_llm_metadata_keys=hidden,
            excluded_embed_metadata_keys=hidden,
            **identity,
        )
        nodes.append(NodeWithScore(node=node, score=doc.score))
    return nodes
