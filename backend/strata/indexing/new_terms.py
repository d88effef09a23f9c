"""Front-matter terms and the note a run gives when the BM25 analyzer may split them.

A document's ``module`` and ``skill_points`` are terms the jieba analyzer should keep whole; the
collection's dictionary is fixed when the collection is created, so a run notes the terms it lacks
(or, for a service whose keys may be scoped to some kbs, the terms new to the kb).
"""

from __future__ import annotations

from collections.abc import Sequence

from strata.indexing.plan import Scan
from strata.indexing.report import IndexReport
from strata.stores.leaf_index import LeafIndex
from strata.stores.leaf_schema import dictionary_terms
from strata.types import SourceDocument


def front_matter_terms(docs: Sequence[SourceDocument]) -> list[str]:
    """The modules and skill points of documents' front-matter (terms the BM25 analyzer keeps whole)."""
    terms: dict[str, None] = {}
    for doc in docs:
        if isinstance(doc.metadata.get("module"), str):
            terms[doc.metadata["module"]] = None
        terms.update(dict.fromkeys(str(p) for p in doc.metadata.get("skill_points") or ()))
    return [t for t in terms if t.strip()]


def note_new_terms(
    report: IndexReport, index: LeafIndex, kb_id: str, scan: Scan, kb_terms: frozenset[str] | None
) -> None:
    """Notes the front-matter terms jieba may split: those the collection's dictionary lacks or, with
    ``kb_terms``, those new to the kb. The dictionary holds every kb's terms of when the collection was
    created, so a note from it would tell a key scoped to one kb which terms other kbs have."""
    dictionary = index.dictionary_for(kb_id)
    if not dictionary and index.analyzer_tokenizer != "jieba":
        return
    terms = dictionary_terms(front_matter_terms(scan.docs))
    new = sorted(terms - (dictionary if kb_terms is None else kb_terms))
    if not new:
        return
    shown = ", ".join(new[:5]) + (" ..." if len(new) > 5 else "")
    if kb_terms is None:
        what = f"not in the BM25 dictionary of this collection ({shown}); jieba may split them"
    else:
        what = (
            f"new to this knowledge base ({shown}); the collection's BM25 dictionary is fixed when the collection is "
            "created, so jieba may split a term added since"
        )
    report.noted(
        f"{len(new)} front-matter term(s) {what} until the leaves are rebuilt into a new collection "
        "(strata rebuild --kb KB --collection NEW)"
    )
