"""The LlamaIndex auto-merging peer of scripts/bench_peers.py, on a tiny corpus with a bag-of-words encoder."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.schema import MetadataMode

from strata.evaluation.auto_merge_peer import (
    EncoderEmbedding,
    build_peer,
    load_or_build_peer,
    peer_documents,
)
from strata.evaluation.dataset import Article, Paragraph, article_markdown

pytestmark = [pytest.mark.unit, pytest.mark.cost(5)]


class BagOfWordsEncoder:
    """Each word hashed into one of 64 dimensions: texts sharing words are near, at no cost."""

    name, dim = "test-bow", 64

    def __init__(self) -> None:
        self.passages = 0

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"[a-z]+", text.lower()):
                vectors[row, zlib.crc32(word.encode()) % self.dim] += 1
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passages += len(texts)
        return self._encode(texts)


def article(doc_id: str, topic: str, sentences: int) -> Article:
    body = " ".join(f"The {topic} widget number {i} has a {topic} handle." for i in range(sentences))
    return Article(doc_id=doc_id, title=topic.title(), paragraphs=(Paragraph(f"{doc_id}_0", body),))


ARTICLES = [article("a", "walnut", 60), article("b", "copper", 60)]


def test_documents_carry_the_article_text_and_keep_the_id_out_of_the_embedding() -> None:
    documents = peer_documents(ARTICLES)
    assert [d.text for d in documents] == [article_markdown(a) for a in ARTICLES]
    assert documents[1].metadata["doc_id"] == "b"
    assert "doc_id" not in documents[1].get_content(MetadataMode.EMBED)


def test_retrieval_returns_the_questions_article_and_merges_its_leaves_into_parents() -> None:
    peer = build_peer(ARTICLES, EncoderEmbedding(BagOfWordsEncoder()))
    assert peer.leaves < peer.nodes
    leaf_items = peer.retrieve("which walnut widget handle", 1)
    assert [i.doc_id for i in leaf_items] == ["a"]
    # every leaf of article a retrieved: more than half of each parent's children, so parents replace them
    merged = peer.retrieve("which walnut widget handle", peer.leaves // 2)
    assert {i.doc_id for i in merged} == {"a"}
    assert len(merged) < peer.leaves // 2
    assert max(len(i.text) for i in merged) > 2 * len(leaf_items[0].text)


def test_a_stored_peer_is_reused_for_the_same_articles_only(tmp_path: Path) -> None:
    encoder = BagOfWordsEncoder()
    embedding = EncoderEmbedding(encoder)
    first, reused = load_or_build_peer(ARTICLES, embedding, encoder, tmp_path)
    encoded = encoder.passages
    again, reused_again = load_or_build_peer(ARTICLES, embedding, encoder, tmp_path)
    assert (reused, reused_again, encoder.passages) == (False, True, encoded)
    question = "copper handle"
    assert again.retrieve(question, 3) == first.retrieve(question, 3)
    _, rebuilt = load_or_build_peer(ARTICLES[:1], embedding, encoder, tmp_path)
    assert rebuilt is False
