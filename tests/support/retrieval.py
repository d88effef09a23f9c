"""Querying a kb in the tests: a retriever with parts replaced, the texts of a result, and the top 10 of
many queries for comparing two copies of a kb."""

from __future__ import annotations

from typing import Any

from strata.config import Settings
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.types import RetrievalResult


def retriever(settings: Settings, memo_encoder, *, warm_up_first: bool = True, **parts: Any) -> Retriever:
    """A retriever on stores of its own, with ``parts`` (``leaf_index=``, ``encoder=``, ...) given instead of the
    configured ones: fault injection."""
    resources = Resources(settings, **{"encoder": memo_encoder, **parts})
    return Retriever(resources, warm_up_first=warm_up_first)


def texts(result: RetrievalResult) -> list[str]:
    return [d.content for d in result.docs]


QUERIES = 100  # queries compared between two copies of a kb


def leaf_texts(resources: Resources, kb: str) -> list[str]:
    documents = resources.documents
    return [
        leaf.text
        for v in documents.versions.of_kb(kb)
        if v.status == "active"
        for leaf in documents.chunks.version_chunks(kb, v.doc_id, v.version, levels=(3,))
    ]


def cut_queries(texts: list[str]) -> list[str]:
    candidates = [t[:24].strip() for t in texts] + [t[-24:].strip() for t in texts]
    unique = [q for q in dict.fromkeys(candidates) if q]
    assert len(unique) >= QUERIES
    return unique[:QUERIES]


def top10(resources: Resources, queries: list[str], kb: str) -> list[list[str]]:
    retriever = Retriever(resources)
    try:
        results = [retriever.retrieve(q, 10, kb_ids=[kb]) for q in queries]
    finally:
        retriever.close()
    assert all(r.meta.status == "ok" for r in results)
    assert {d.metadata["kb_id"] for r in results for d in r.docs} == {kb}
    return [[d.metadata["chunk_id"] for d in r.docs] for r in results]
