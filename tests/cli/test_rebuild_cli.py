"""``strata rebuild``, run as a user runs it: copy a kb into a second Milvus Lite file, rebuild in place.

Every command is a subprocess (Milvus Lite lets one process hold its file);
the test process opens one file at a time, only between commands (``opened``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from strata.config import Settings
from strata.rag.retrieve import Retriever
from tests.support.paths import REPO
from tests.support.processes import run_strata, strata_env
from tests.support.snapshots import store_state
from tests.support.stores import opened, settings_for

pytestmark = [pytest.mark.slow, pytest.mark.cost(30)]  # strata in processes of its own

EXAMPLES_KB = REPO / "examples" / "kb"
QUERIES = 100


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """examples/kb indexed as kb ``demo`` by ``strata index``; the environment of that data dir."""
    env = strata_env(tmp_path_factory.mktemp("rebuild") / "data")
    done = run_strata(["index", str(EXAMPLES_KB), "--kb", "demo", "--json"], env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["failed"] == 0
    return env


def _rebuild(env: dict[str, str], *args: str) -> dict[str, Any]:
    done = run_strata(["rebuild", "--kb", "demo", "--json", *args], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _queries(settings: Settings, encoder: Any) -> list[str]:
    """Queries made from the kb's own leaves: heading paths and the opening words of leaf texts."""
    with opened(settings, encoder) as resources:
        documents = resources.documents
        leaves = [
            leaf
            for v in documents.versions.of_kb("demo")
            for leaf in documents.chunks.version_chunks("demo", v.doc_id, v.version, levels=(3,))
        ]
    texts = [leaf.heading_path.split(" > ")[-1] for leaf in leaves if leaf.heading_path]
    texts += [leaf.text[:24] for leaf in leaves] + [leaf.text[-24:] for leaf in leaves]
    unique = [t for t in dict.fromkeys(t.strip() for t in texts) if t]
    assert len(unique) >= QUERIES, f"only {len(unique)} distinct queries in the kb"
    return unique[:QUERIES]


def _top10(settings: Settings, encoder: Any, queries: list[str]) -> list[list[str]]:
    with opened(settings, encoder) as resources:
        retriever = Retriever(resources)
        try:
            results = [retriever.retrieve(q, 10, kb_ids=["demo"]) for q in queries]
        finally:
            retriever.close()
    assert all(r.meta.status == "ok" for r in results), [r.meta.errors for r in results if r.meta.status != "ok"]
    return [[d.metadata["chunk_id"] for d in r.docs] for r in results]


@pytest.mark.parametrize(
    "level", [None, "collection", "partition_key"], ids=["same-level", "to-collection", "to-partition-key"]
)
def test_copy_to_a_second_file_answers_the_same_top10(
    demo: dict[str, str], tmp_path: Path, memo_encoder: Any, level: str | None
) -> None:
    """A copy at the source's level, or moved to another isolation level (``--isolation``), is verified against SQL
    and answers as the source does; the copy's level is read back from Milvus by a default-configured strata."""
    copy = tmp_path / "copy.db"
    report = _rebuild(demo, "--to-uri", str(copy), *(["--isolation", level] if level else []))

    source = settings_for(demo)
    assert report["verified"] is True and report["in_place"] is False
    assert report["isolation"] == (level or "partition")  # a Lite file's default level is a partition per kb
    assert report["target_uri"] == str(copy) and report["leaves_written"] == report["sql_leaves"] > 0
    assert (report["encoded"], report["reused"]) == (0, report["leaves_written"])  # the cache is warm
    assert report["next_step"] == f"export STRATA_MILVUS__URI={copy}" + (
        f" && export STRATA_MILVUS__ISOLATION={level}" if level else ""
    )

    queries = _queries(source, memo_encoder)
    original = _top10(source, memo_encoder, queries)
    copied = _top10(
        source.model_copy(update={"milvus": source.milvus.model_copy(update={"uri": str(copy)})}), memo_encoder, queries
    )
    assert sum(len(ids) for ids in original) >= 5 * QUERIES  # real answers, not two empty lists
    assert copied == original


def test_text_output_prints_the_next_step(demo: dict[str, str], tmp_path: Path) -> None:
    copy = tmp_path / "next.db"
    done = run_strata(["rebuild", "--kb", "demo", "--to-uri", str(copy), "--collection", "leaves_v2"], demo)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith(f"rebuilt kb demo into {copy} (collection leaves_v2, isolation partition):")
    assert lines[-1] == f"next step: export STRATA_MILVUS__URI={copy} && export STRATA_MILVUS__COLLECTION=leaves_v2"


def test_in_place_rebuild_restores_leaves_deleted_from_milvus(demo: dict[str, str], memo_encoder: Any) -> None:
    settings = settings_for(demo)
    with opened(settings, memo_encoder) as resources:
        expected = {
            leaf.chunk_id
            for v in resources.documents.versions.of_kb("demo")
            for leaf in resources.documents.chunks.version_chunks("demo", v.doc_id, v.version, levels=(3,))
        }
        resources.leaf_index.delete_leaves("demo", sorted(expected)[::3])
        resources.leaf_index.flush()
        assert resources.leaf_index.count("demo") < len(expected)
    assert run_strata(["stats", "--kb", "demo"], demo).returncode == 1  # the stores disagree now

    report = _rebuild(demo)

    assert report["in_place"] is True and report["verified"] is True and report["encoded"] == 0
    assert report["milvus_leaves"] == len(expected)
    assert run_strata(["stats", "--kb", "demo"], demo).returncode == 0
    with opened(settings, memo_encoder) as resources:
        store_state(resources, "demo").assert_consistent()


def test_a_kb_that_does_not_exist_exits_1_with_one_line(demo: dict[str, str], tmp_path: Path) -> None:
    done = run_strata(["rebuild", "--kb", "nope", "--to-uri", str(tmp_path / "x.db")], demo)

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == ["strata: NotFoundError: no knowledge base 'nope'"]


def test_the_configured_milvus_as_target_is_refused(demo: dict[str, str]) -> None:
    done = run_strata(["rebuild", "--kb", "demo", "--to-uri", str(Path(demo["STRATA_DATA_DIR"]) / "milvus.db")], demo)

    assert done.returncode == 2
    assert "omit --to-uri and --collection to rebuild in place" in done.stderr
