"""Document frequency of the BM25 analyzer's terms, kept per document version (SQL).

``strata_version_terms`` holds, for each document version, every distinct term
of its leaves' search texts with the number of the version's leaves that hold
it, plus a marker row (term ``""``) saying the version's terms were counted (a
version with leaves may still have no terms). The rows are written in the
transaction that writes the version's chunks and deleted with them, so the df
of a term over some kbs is the sum over their active versions, and the number
of leaves N the sum of those versions' ``leaf_count``. ``DocumentStore`` calls
these functions with its own connections.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from sqlalchemy import ColumnElement, and_, exists, func, select
from sqlalchemy.engine import Connection

from backend.stores.analyzer import Tokenize
from backend.stores.sql_schema import documents, version_terms
from backend.types import ACTIVE

COUNTED = ""  # the marker term of a counted version (the analyzer never yields an empty token)
MAX_TERM_CHARS = 64  # longer tokens are not kept: rare by nature, so a query keeps them anyway

_IN_BATCH = 900
_INSERT_BATCH = 500


@dataclass(frozen=True)
class TermFrequencies:
    """The active leaves of some kbs and, per asked term, how many of them hold it (0: none or not counted)."""

    leaves: int
    df: Mapping[str, int] = field(default_factory=dict)


def count_terms(texts: Iterable[str], tokenize: Tokenize) -> dict[str, int]:
    """Per distinct term of ``texts``: the number of texts that hold it (terms over ``MAX_TERM_CHARS`` left out)."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update({t for t in tokenize(text) if len(t) <= MAX_TERM_CHARS})
    return dict(counts)


def insert_version_terms(conn: Connection, kb_id: str, doc_id: str, version: int, counts: Mapping[str, int]) -> None:
    """The version's term rows and its marker (after its old rows were deleted)."""
    key = {"kb_id": kb_id, "doc_id": doc_id, "version": version}
    rows = [{**key, "term": COUNTED, "leaf_df": 0}]
    rows += [{**key, "term": term, "leaf_df": n} for term, n in counts.items() if term and len(term) <= MAX_TERM_CHARS]
    for start in range(0, len(rows), _INSERT_BATCH):
        conn.execute(version_terms.insert(), rows[start : start + _INSERT_BATCH])


def read_term_frequencies(conn: Connection, kb_ids: Sequence[str], terms: Sequence[str]) -> TermFrequencies:
    """The df of each of ``terms`` summed over the active versions of ``kb_ids``, and their leaf count."""
    kbs = list(dict.fromkeys(kb_ids))
    leaves = conn.execute(
        select(func.coalesce(func.sum(documents.c.leaf_count), 0)).where(
            documents.c.kb_id.in_(kbs), documents.c.status == ACTIVE
        )
    ).scalar_one()
    asked = [t for t in dict.fromkeys(terms) if t and len(t) <= MAX_TERM_CHARS]
    df = dict.fromkeys(terms, 0)
    for start in range(0, len(asked), _IN_BATCH):
        query = (
            select(version_terms.c.term, func.sum(version_terms.c.leaf_df))
            .join(documents, _of_active_version())
            .where(version_terms.c.kb_id.in_(kbs), version_terms.c.term.in_(asked[start : start + _IN_BATCH]))
            .group_by(version_terms.c.term)
        )
        df.update({term: int(n) for term, n in conn.execute(query)})
    return TermFrequencies(leaves=int(leaves), df=df)


def uncounted_versions(conn: Connection, kb_id: str) -> list[tuple[str, int]]:
    """(doc id, version) of the kb's active versions with leaves whose terms were never counted."""
    counted = exists().where(
        version_terms.c.kb_id == documents.c.kb_id, version_terms.c.doc_id == documents.c.doc_id,
        version_terms.c.version == documents.c.version, version_terms.c.term == COUNTED,
    )  # fmt: skip
    query = select(documents.c.doc_id, documents.c.version).where(
        documents.c.kb_id == kb_id, documents.c.status == ACTIVE, documents.c.leaf_count > 0, ~counted
    )
    return [(r.doc_id, r.version) for r in conn.execute(query.order_by(documents.c.doc_id, documents.c.version))]


def _of_active_version() -> ColumnElement[bool]:
    return and_(
        documents.c.kb_id == version_terms.c.kb_id, documents.c.doc_id == version_terms.c.doc_id,
        documents.c.version == version_terms.c.version, documents.c.status == ACTIVE,
    )  # fmt: skip
