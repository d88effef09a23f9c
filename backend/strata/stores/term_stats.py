"""Document frequency of the BM25 analyzer's terms, kept per document version (SQL).

``strata_version_terms`` holds, for each document version, every distinct term
of its leaves' search texts with the number of the version's leaves that hold
it, plus a marker row (term ``""``) saying the version's terms were counted (a
version with leaves may still have no terms). The rows are written in the
transaction that writes the version's chunks and deleted with them, so the df
of a term over some kbs is the sum over their active versions, and the number
of leaves N the sum of those versions' ``leaf_count``.

``strata_kb_terms`` keeps that sum per kb: a version's terms are added when it
starts serving and subtracted when it stops, in the transaction that changes
its status. So the terms frequent enough to prune (df over ``max_df`` x N) are
one indexed read per kb generation, whatever the query. The functions run in
a caller's transaction (``DocumentVersions`` changes a status and the sums in
one); ``TermStatistics`` is the store's own reads and backfills.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, and_, delete, exists, func, insert, select
from sqlalchemy import text as sql_text
from sqlalchemy.engine import Connection

from strata.stores.analyzer import Tokenize
from strata.stores.sql_database import SqlPart
from strata.stores.sql_schema import documents, kb_terms, version_terms
from strata.types import ACTIVE

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
        add_terms(counts, text, tokenize)
    return dict(counts)


def add_terms(counts: Counter[str], text: str, tokenize: Tokenize) -> None:
    """Counts one more text into ``counts`` (``count_terms`` a text at a time)."""
    counts.update({t for t in tokenize(text) if len(t) <= MAX_TERM_CHARS})


def insert_version_terms(conn: Connection, kb_id: str, doc_id: str, version: int, counts: Mapping[str, int]) -> None:
    """The version's term rows and its marker (after its old rows were deleted)."""
    insert_term_rows(conn, version_term_rows(kb_id, doc_id, version, counts))


def version_term_rows(kb_id: str, doc_id: str, version: int, counts: Mapping[str, int]) -> list[dict[str, Any]]:
    """The rows ``insert_version_terms`` writes: the marker that the version was counted, then a row per term."""
    key = {"kb_id": kb_id, "doc_id": doc_id, "version": version}
    rows = [{**key, "term": COUNTED, "leaf_df": 0}]
    rows += [{**key, "term": term, "leaf_df": n} for term, n in counts.items() if term and len(term) <= MAX_TERM_CHARS]
    return rows


def insert_term_rows(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Term rows of one or many versions, a few hundred per statement."""
    for start in range(0, len(rows), _INSERT_BATCH):
        conn.execute(version_terms.insert(), list(rows[start : start + _INSERT_BATCH]))


def uncounted_versions(conn: Connection, kb_id: str) -> list[tuple[str, int]]:
    """(doc id, version) of the kb's active versions with leaves whose terms were never counted."""
    counted = exists().where(
        version_terms.c.kb_id == documents.c.kb_id,
        version_terms.c.doc_id == documents.c.doc_id,
        version_terms.c.version == documents.c.version,
        version_terms.c.term == COUNTED,
    )
    query = select(documents.c.doc_id, documents.c.version).where(
        documents.c.kb_id == kb_id, documents.c.status == ACTIVE, documents.c.leaf_count > 0, ~counted
    )
    return [(r.doc_id, r.version) for r in conn.execute(query.order_by(documents.c.doc_id, documents.c.version))]


def _of_active_version() -> ColumnElement[bool]:
    return and_(
        documents.c.kb_id == version_terms.c.kb_id,
        documents.c.doc_id == version_terms.c.doc_id,
        documents.c.version == version_terms.c.version,
        documents.c.status == ACTIVE,
    )


# Both SQLite (3.24+) and PostgreSQL read this upsert; the WHERE keeps SQLite's parser from taking ON for a join.
_ADD = sql_text(
    "INSERT INTO strata_kb_terms (kb_id, term, df) SELECT kb_id, term, leaf_df FROM strata_version_terms "
    "WHERE kb_id = :kb AND doc_id = :doc AND version = :version AND term <> '' "
    "ON CONFLICT (kb_id, term) DO UPDATE SET df = strata_kb_terms.df + excluded.df"
)
_SUBTRACT = sql_text(
    "UPDATE strata_kb_terms SET df = df - (SELECT v.leaf_df FROM strata_version_terms v WHERE v.kb_id = :kb "
    "AND v.doc_id = :doc AND v.version = :version AND v.term = strata_kb_terms.term) "
    "WHERE kb_id = :kb AND term IN (SELECT term FROM strata_version_terms WHERE kb_id = :kb AND doc_id = :doc "
    "AND version = :version AND term <> '')"
)


def start_serving(conn: Connection, kb_id: str, doc_id: str, version: int) -> None:
    """Adds the version's terms to its kb's df (the version became active)."""
    conn.execute(_ADD, {"kb": kb_id, "doc": doc_id, "version": version})


def stop_serving(conn: Connection, kb_id: str, doc_id: str, version: int) -> None:
    """Subtracts the version's terms from its kb's df (the version stopped being active);
    ``drop_absent_terms`` clears the terms left at 0 once the transaction's changes are done."""
    conn.execute(_SUBTRACT, {"kb": kb_id, "doc": doc_id, "version": version})


def drop_absent_terms(conn: Connection, kb_id: str) -> None:
    conn.execute(delete(kb_terms).where(kb_terms.c.kb_id == kb_id, kb_terms.c.df <= 0))


def rebuild_kb_terms(conn: Connection, kb_id: str) -> int:
    """The kb's df summed anew from its active versions (after a backfill or a repair); returns the terms kept."""
    conn.execute(delete(kb_terms).where(kb_terms.c.kb_id == kb_id))
    summed = (
        select(version_terms.c.kb_id, version_terms.c.term, func.sum(version_terms.c.leaf_df))
        .join(documents, _of_active_version())
        .where(version_terms.c.kb_id == kb_id, version_terms.c.term != COUNTED)
        .group_by(version_terms.c.kb_id, version_terms.c.term)
    )
    conn.execute(insert(kb_terms).from_select(["kb_id", "term", "df"], summed))
    return int(conn.execute(select(func.count()).select_from(kb_terms).where(kb_terms.c.kb_id == kb_id)).scalar_one())


def kb_terms_missing(conn: Connection, kb_id: str) -> bool:
    """True when the kb has counted versions but no summed df (a database from before the sums were kept)."""
    has_sums = conn.execute(select(kb_terms.c.term).where(kb_terms.c.kb_id == kb_id).limit(1)).first()
    has_terms = conn.execute(
        select(version_terms.c.term).where(version_terms.c.kb_id == kb_id, version_terms.c.term != COUNTED).limit(1)
    ).first()
    return has_sums is None and has_terms is not None


def read_frequent_terms(conn: Connection, kb_ids: Sequence[str], max_df: float) -> TermFrequencies:
    """The active leaves of ``kb_ids`` and every term in more than ``max_df`` of them, with its df.

    A term over ``max_df`` of the union is over ``max_df`` of at least one kb, so each kb's own
    frequent terms are the candidates, summed over all the kbs afterwards.
    """
    kbs = list(dict.fromkeys(kb_ids))
    per_kb = dict(
        conn.execute(
            select(documents.c.kb_id, func.sum(documents.c.leaf_count))
            .where(documents.c.kb_id.in_(kbs), documents.c.status == ACTIVE)
            .group_by(documents.c.kb_id)
        ).all()
    )
    leaves = int(sum(per_kb.values()))
    candidates: set[str] = set()
    for kb_id, n in per_kb.items():
        query = select(kb_terms.c.term).where(kb_terms.c.kb_id == kb_id, kb_terms.c.df > max_df * int(n))
        candidates.update(conn.execute(query).scalars())
    df: dict[str, int] = {}
    asked = sorted(candidates)
    for start in range(0, len(asked), _IN_BATCH):
        query = (
            select(kb_terms.c.term, func.sum(kb_terms.c.df))
            .where(kb_terms.c.kb_id.in_(kbs), kb_terms.c.term.in_(asked[start : start + _IN_BATCH]))
            .group_by(kb_terms.c.term)
        )
        df.update({term: int(n) for term, n in conn.execute(query) if int(n) > max_df * leaves})
    return TermFrequencies(leaves=leaves, df=df)


class TermStatistics(SqlPart):
    """The term statistics of a database's kbs (BM25 query hygiene)."""

    def write_terms(self, kb_id: str, doc_id: str, version: int, term_counts: Mapping[str, int]) -> None:
        """Replaces a version's term statistics (a backfill of a version written before they were kept)."""
        with self._begin() as conn:
            conn.execute(
                delete(version_terms).where(
                    version_terms.c.kb_id == kb_id, version_terms.c.doc_id == doc_id, version_terms.c.version == version
                )
            )
            insert_version_terms(conn, kb_id, doc_id, version, term_counts)

    def rebuild_kb_terms(self, kb_id: str) -> int:
        """Sums the kb's term df anew from its active versions (after a backfill or a repair)."""
        with self._begin() as conn:
            return rebuild_kb_terms(conn, kb_id)

    def kb_terms_missing(self, kb_id: str) -> bool:
        """True when the kb's versions are counted but their sums are not (an older database)."""
        with self._connect() as conn:
            return kb_terms_missing(conn, kb_id)

    def frequent_terms(
        self, kb_ids: Sequence[str], max_df: float, *, timeout_s: float | None = None
    ) -> TermFrequencies:
        """The active leaves of ``kb_ids`` and the terms in more than ``max_df`` of them (indexed reads
        of the kbs' term sums, under the query timeout)."""
        with self._query_path(timeout_s) as conn:
            return read_frequent_terms(conn, kb_ids, max_df)

    def uncounted_versions(self, kb_id: str) -> list[tuple[str, int]]:
        """(doc id, version) of the kb's active versions whose term statistics are missing."""
        with self._connect() as conn:
            return uncounted_versions(conn, kb_id)
