"""Term statistics of document versions, for BM25 query hygiene (``strata.rag.bm25_hygiene``).

A version's terms are counted from its leaves' search texts, with the BM25
analyzer's own tokenizer, and written with its chunks. Versions written before
strata kept them are counted from their SQL chunks by ``backfill_term_stats``,
at the start of every ``strata index`` run and by ``strata reconcile --repair``,
which then sum the kb's df anew (``strata_kb_terms``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from strata.errors import UnsupportedAnalyzer
from strata.indexing.embedding import search_text
from strata.resources import Resources
from strata.stores.analyzer import Tokenize, analyzer_tokenizer
from strata.stores.term_stats import count_terms
from strata.types import Chunk

logger = logging.getLogger(__name__)


def term_tokenizer(resources: Resources) -> tuple[Tokenize | None, str]:
    """The BM25 analyzer's tokenizer, or None and why term statistics cannot be kept for it."""
    try:
        return analyzer_tokenizer(resources.settings.milvus.analyzer), ""
    except UnsupportedAnalyzer as exc:
        return None, f"term statistics are not kept: {exc}"


def leaf_term_counts(chunks: Sequence[Chunk], tokenize: Tokenize, *, contextualize: bool) -> dict[str, int]:
    """Per term of the leaves' search texts: how many of the leaves hold it."""
    return count_terms((search_text(c, contextualize) for c in chunks if c.is_leaf), tokenize)


def backfill_term_stats(resources: Resources, kb_id: str, tokenize: Tokenize) -> int:
    """Counts the terms of the kb's active versions that have none; returns how many versions it counted.

    Call it with the leaf index open: the collection's user dictionary is then in jieba's.
    """
    store = resources.documents
    contextualize = resources.settings.chunking.contextualize
    missing = store.terms.uncounted_versions(kb_id)
    for doc_id, version in missing:
        leaves = store.chunks.version_chunks(kb_id, doc_id, version, levels=(3,))
        store.terms.write_terms(kb_id, doc_id, version, leaf_term_counts(leaves, tokenize, contextualize=contextualize))
    if missing:
        logger.info(
            "counted the terms of %d versions of %s written before term statistics were kept", len(missing), kb_id
        )
    if missing or store.terms.kb_terms_missing(kb_id):
        store.terms.rebuild_kb_terms(kb_id)  # the kb's sums, from every active version's counts
    return len(missing)
