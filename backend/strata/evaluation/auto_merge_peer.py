"""The peer hierarchical-RAG users compare strata with: LlamaIndex's auto-merging retriever, by its own recipe.

LlamaIndex's documented recipe (llama-index-core, the ``llamaindex`` extra), with nothing of strata's
chunker, index or retrieval:

- documents: the text each article is indexed from (``dataset.article_text``: docs/evaluation.md §2's Markdown, or an rst page), the text
  strata indexes once its front matter is read), the article id in the metadata, kept out of what is embedded;
- nodes: ``HierarchicalNodeParser.from_defaults(chunk_sizes=[2048, 512, 128])`` (token sizes, LlamaIndex's
  tokenizer: tiktoken's ``cl100k_base``, shipped in llama-index-core's ``_static/tiktoken_cache`` and read
  offline), every node in a docstore;
- a ``VectorStoreIndex`` over the leaves (``get_leaf_nodes``), in LlamaIndex's in-memory vector store, with
  strata's encoder wrapped as a LlamaIndex embedding (``EncoderEmbedding``: ``passage``/``query`` encodings,
  as strata embeds), so both systems search the same vectors of the same model;
- ``AutoMergingRetriever`` over ``as_retriever(similarity_top_k=k)``, its default ``simple_ratio_thresh``
  (0.5): a parent replaces its retrieved children once more than half of them were retrieved, repeatedly.

``AutoMergePeer.retrieve(question, k)`` answers docs/evaluation.md §4's contract with ``metrics.Item``s (a
node's text without metadata, its article id). Importing this module imports llama-index-core.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llama_index.core import Document, StorageContext, VectorStoreIndex, load_index_from_storage
from llama_index.core.base.embeddings.base import BaseEmbedding
from llama_index.core.node_parser import HierarchicalNodeParser, get_leaf_nodes
from llama_index.core.retrievers import AutoMergingRetriever
from pydantic import PrivateAttr

from strata.encoders.base import Encoder
from strata.evaluation.dataset import Article, article_text
from strata.evaluation.metrics import Item

CHUNK_SIZES = (2048, 512, 128)  # tokens: the recipe's levels, largest first
DOC_ID = "doc_id"
EMBED_BATCH = 64
RECIPE_VERSION = 1  # bump when the documents, nodes or index change


class EncoderEmbedding(BaseEmbedding):
    """A strata ``Encoder`` as a LlamaIndex embedding: texts are passages, queries are queries."""

    _encoder: Any = PrivateAttr()
    _queries: dict[str, list[float]] = PrivateAttr(default_factory=dict)

    def __init__(self, encoder: Encoder, **kwargs: Any) -> None:
        super().__init__(model_name=encoder.name, embed_batch_size=EMBED_BATCH, **kwargs)
        self._encoder = encoder
        self._queries = {}

    def _get_query_embedding(self, query: str) -> list[float]:
        # asked once per k: the second call reuses the first's vector
        if query not in self._queries:
            self._queries[query] = [float(x) for x in self._encoder.encode_queries([query])[0]]
        return self._queries[query]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._get_text_embeddings([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in row] for row in self._encoder.encode_passages(texts)]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._get_query_embedding(query)


def peer_documents(articles: Sequence[Article]) -> list[Document]:
    """One LlamaIndex ``Document`` per article: docs/evaluation.md §2's text, the article id kept out of prompts."""
    return [
        Document(
            text=article_text(article),
            metadata={DOC_ID: article.doc_id},
            excluded_embed_metadata_keys=[DOC_ID],
            excluded_llm_metadata_keys=[DOC_ID],
        )
        for article in articles
    ]


def recipe(encoder: Encoder) -> dict[str, Any]:
    """What a stored index was built with; a stored index is reused only for the same recipe and data."""
    return {"version": RECIPE_VERSION, "chunk_sizes": list(CHUNK_SIZES), "encoder": encoder.name, "dim": encoder.dim}


@dataclass(frozen=True)
class AutoMergePeer:
    """The built peer: its index (leaves embedded), the docstore of every node, and its node counts."""

    index: Any
    storage: Any
    nodes: int
    leaves: int

    def retrieve(self, question: str, k: int) -> tuple[Item, ...]:
        """The auto-merging retriever's answer for ``k`` retrieved leaves (merged parents count once)."""
        retriever = AutoMergingRetriever(self.index.as_retriever(similarity_top_k=k), self.storage)
        return tuple(
            Item(text=hit.node.get_content(), doc_id=str(hit.node.metadata[DOC_ID]))
            for hit in retriever.retrieve(question)[:k]
        )


def build_peer(articles: Sequence[Article], embedding: EncoderEmbedding) -> AutoMergePeer:
    """Parses, embeds and indexes ``articles`` by the recipe (in memory)."""
    parser = HierarchicalNodeParser.from_defaults(chunk_sizes=list(CHUNK_SIZES))
    nodes = parser.get_nodes_from_documents(peer_documents(articles))
    leaves = get_leaf_nodes(nodes)
    storage = StorageContext.from_defaults()
    storage.docstore.add_documents(nodes)
    index = VectorStoreIndex(leaves, storage_context=storage, embed_model=embedding, insert_batch_size=512)
    return AutoMergePeer(index, storage, len(nodes), len(leaves))


def load_or_build_peer(
    articles: Sequence[Article], embedding: EncoderEmbedding, encoder: Encoder, home: Path
) -> tuple[AutoMergePeer, bool]:
    """The peer stored under ``home`` when it was built from the same articles and recipe, else built and
    stored there; (peer, reused)."""
    manifest = {"data_sha256": _articles_digest(articles), "recipe": recipe(encoder)}
    manifest_path = home / "manifest.json"
    stored = json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.exists() else None
    if stored is not None and all(stored.get(key) == value for key, value in manifest.items()):
        storage = StorageContext.from_defaults(persist_dir=str(home))
        index = load_index_from_storage(storage, embed_model=embedding)
        return AutoMergePeer(index, storage, int(stored["nodes"]), int(stored["leaves"])), True
    peer = build_peer(articles, embedding)
    home.mkdir(parents=True, exist_ok=True)
    peer.storage.persist(persist_dir=str(home))
    record = {**manifest, "nodes": peer.nodes, "leaves": peer.leaves}
    manifest_path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return peer, False


def _articles_digest(articles: Sequence[Article]) -> str:
    digest = hashlib.sha256()
    for article in articles:
        digest.update(article.doc_id.encode() + b"\0" + article_text(article).encode() + b"\0")
    return digest.hexdigest()
