"""Term statistics in the SQL store (BM25 query hygiene), on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, select

from strata.stores.sql import DocumentStore, DocumentVersion
from strata.stores.sql_schema import version_terms
from strata.stores.term_stats import MAX_TERM_CHARS, TermFrequencies, count_terms
from tests.support.documents import make_chunks
from tests.support.snapshots import term_frequencies


@pytest.fixture
def store(database_settings) -> DocumentStore:
    store = DocumentStore(database_settings)
    yield store
    store.dispose()


def _write(
    store: DocumentStore, kb: str, doc: str, version: int, counts: dict[str, int] | None, leaves: int = 6
) -> None:
    chunks = make_chunks(kb, doc, version)
    store.versions.write_pending(DocumentVersion(kb, doc, version, f"{doc}.md", "h", leaf_count=leaves), chunks, counts)


def _rows(store: DocumentStore, kb: str) -> int:
    with store.engine.connect() as conn:
        return len(conn.execute(select(version_terms).where(version_terms.c.kb_id == kb)).all())


def test_count_terms_counts_leaves_not_occurrences() -> None:
    counts = count_terms(["a b a", "b c", "x" * (MAX_TERM_CHARS + 1)], str.split)
    assert counts == {"a": 1, "b": 2, "c": 1}


def test_df_sums_over_the_active_versions_of_the_kbs(store: DocumentStore) -> None:
    for kb in ("kb1", "kb2"):
        store.kbs.ensure_kb(kb, encoder="e", dim=3, chunking="c")
    _write(store, "kb1", "a.md", 1, {"the": 6, "warranty": 2})
    _write(store, "kb1", "b.md", 1, {"the": 5, "shipping": 3}, leaves=5)
    _write(store, "kb2", "c.md", 1, {"the": 4, "warranty": 1}, leaves=4)
    assert term_frequencies(store, ["kb1"], ["the"]) == TermFrequencies(0, {"the": 0})  # pending: not served
    for kb, doc in (("kb1", "a.md"), ("kb1", "b.md"), ("kb2", "c.md")):
        store.versions.activate(kb, doc, 1)
    assert term_frequencies(store, ["kb1"], ["the", "warranty", "nowhere", "x" * 80]) == TermFrequencies(
        11, {"the": 11, "warranty": 2, "nowhere": 0, "x" * 80: 0}
    )
    assert term_frequencies(store, ["kb1", "kb2"], ["the", "warranty"]) == TermFrequencies(
        15, {"the": 15, "warranty": 3}
    )
    assert term_frequencies(store, [], ["the"]) == TermFrequencies(0, {"the": 0})


def test_a_new_version_replaces_the_old_ones_terms_and_deletion_removes_them(store: DocumentStore) -> None:
    store.kbs.ensure_kb("kb", encoder="e", dim=3, chunking="c")
    _write(store, "kb", "a.md", 1, {"old": 6, "both": 6})
    store.versions.activate("kb", "a.md", 1)
    _write(store, "kb", "a.md", 2, {"new": 2, "both": 3}, leaves=3)
    assert term_frequencies(store, ["kb"], ["old", "new", "both"]).df == {"old": 6, "new": 0, "both": 6}
    store.versions.activate("kb", "a.md", 2)
    assert term_frequencies(store, ["kb"], ["old", "new", "both"]) == TermFrequencies(
        3, {"old": 0, "new": 2, "both": 3}
    )
    store.versions.delete_version("kb", "a.md", 1)
    assert _rows(store, "kb") == 3  # version 2: two terms and its marker
    _write(store, "kb", "a.md", 2, {"again": 3}, leaves=3)  # a rerun of the same version rewrites its rows
    assert _rows(store, "kb") == 2
    store.kbs.drop_kb("kb")
    assert _rows(store, "kb") == 0


def test_versions_written_without_term_counts_are_found_and_backfilled(store: DocumentStore) -> None:
    store.kbs.ensure_kb("kb", encoder="e", dim=3, chunking="c")
    _write(store, "kb", "legacy.md", 1, None)
    _write(store, "kb", "empty.md", 1, None, leaves=0)  # no leaves: nothing to count
    _write(store, "kb", "blank.md", 1, {})  # counted, and no term at all
    _write(store, "kb", "pending.md", 1, None)
    for doc in ("legacy.md", "empty.md", "blank.md"):
        store.versions.activate("kb", doc, 1)
    assert store.terms.uncounted_versions("kb") == [("legacy.md", 1)]
    store.terms.write_terms("kb", "legacy.md", 1, {"the": 6})
    store.terms.write_terms("kb", "legacy.md", 1, {"the": 5})  # idempotent: replaces
    assert store.terms.uncounted_versions("kb") == []
    assert term_frequencies(store, ["kb"], ["the"]) == TermFrequencies(12, {"the": 5})


def test_the_df_lookup_is_indexed_by_kb_and_term(store: DocumentStore) -> None:
    indexes = {i["name"]: i["column_names"] for i in inspect(store.engine).get_indexes("strata_version_terms")}
    assert indexes["ix_strata_version_terms_term"] == ["kb_id", "term"]
    assert inspect(store.engine).get_pk_constraint("strata_version_terms")["constrained_columns"] == [
        "kb_id",
        "doc_id",
        "version",
        "term",
    ]


def _sums_by_aggregate(store: DocumentStore, kb: str) -> dict[str, int]:
    """The kb's df the slow way (every active version's counts summed), to check the kept sums against."""
    with store.engine.connect() as conn:
        terms = {t for (t,) in conn.execute(select(version_terms.c.term).where(version_terms.c.kb_id == kb)) if t}
    return {t: n for t, n in term_frequencies(store, [kb], sorted(terms)).df.items() if n > 0}


def test_the_kept_sums_follow_every_status_change_and_answer_the_frequent_terms(store: DocumentStore) -> None:
    store.kbs.ensure_kb("kb", encoder="e", dim=3, chunking="c")
    _write(store, "kb", "a.md", 1, {"the": 6, "warranty": 2})
    _write(store, "kb", "b.md", 1, {"the": 4, "shipping": 4}, leaves=4)
    assert store.terms.frequent_terms(["kb"], 0.0) == TermFrequencies(0, {})  # pending: nothing serves
    store.versions.switch("kb", [("a.md", 1), ("b.md", 1)])
    assert (
        store.terms.frequent_terms(["kb"], 0.0).df
        == _sums_by_aggregate(store, "kb")
        == {"the": 10, "warranty": 2, "shipping": 4}
    )
    assert store.terms.frequent_terms(["kb"], 0.5) == TermFrequencies(10, {"the": 10})  # over half of 10 leaves
    store.versions.activate("kb", "a.md", 1)  # activating what already serves changes nothing
    assert store.terms.frequent_terms(["kb"], 0.0).df == {"the": 10, "warranty": 2, "shipping": 4}

    _write(store, "kb", "a.md", 2, {"the": 1, "claims": 3}, leaves=3)  # an update: v2 replaces v1
    store.versions.activate("kb", "a.md", 2)
    assert (
        store.terms.frequent_terms(["kb"], 0.0).df
        == _sums_by_aggregate(store, "kb")
        == {"the": 5, "claims": 3, "shipping": 4}
    )
    store.versions.retire_document("kb", "b.md")  # a deletion
    assert store.terms.frequent_terms(["kb"], 0.0).df == _sums_by_aggregate(store, "kb") == {"the": 1, "claims": 3}
    store.versions.switch("kb", [], retire=["a.md"])  # a --recreate's switch that retires the rest
    assert store.terms.frequent_terms(["kb"], 0.0) == TermFrequencies(0, {})
    store.kbs.drop_kb("kb")
    assert store.terms.frequent_terms(["kb"], 0.0) == TermFrequencies(0, {})


def test_frequent_terms_of_several_kbs_are_frequent_in_their_union(store: DocumentStore) -> None:
    for kb, counts, leaves in (("kb1", {"rare": 1, "common": 9}, 10), ("kb2", {"rare": 2, "other": 90}, 100)):
        store.kbs.ensure_kb(kb, encoder="e", dim=3, chunking="c")
        _write(store, kb, "d.md", 1, counts, leaves=leaves)
        store.versions.activate(kb, "d.md", 1)
    assert store.terms.frequent_terms(["kb1"], 0.5).df == {"common": 9}
    # over the 110 leaves of both, "common" (9) is rare and "other" (90) is not
    assert store.terms.frequent_terms(["kb1", "kb2"], 0.5, timeout_s=2) == TermFrequencies(110, {"other": 90})


def test_sums_missing_from_an_older_database_are_rebuilt(store: DocumentStore) -> None:
    store.kbs.ensure_kb("kb", encoder="e", dim=3, chunking="c")
    _write(store, "kb", "a.md", 1, {"the": 6, "warranty": 2})
    store.versions.activate("kb", "a.md", 1)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM strata_kb_terms")
    assert store.terms.kb_terms_missing("kb") and store.terms.frequent_terms(["kb"], 0.0).df == {}
    assert store.terms.rebuild_kb_terms("kb") == 2
    assert not store.terms.kb_terms_missing("kb") and store.terms.frequent_terms(["kb"], 0.0).df == {
        "the": 6,
        "warranty": 2,
    }
