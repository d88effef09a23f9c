"""A kb updated by a run that crashes at a write step (tests/indexing/test_pipeline.py, tests/faults)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from strata.indexing.pipeline import WRITE_STEPS
from strata.indexing.rebuild import Rebuilder
from tests.support.documents import write_files
from tests.support.milvus import MilvusTarget
from tests.support.processes import strata_env
from tests.support.stores import opened, settings_for

CRASH_KB = "crash"

CRASH_V1 = {
    "retention.md": "# Retention\n\nDeleted notes stay in the trash for thirty days, then the trash is emptied "
    "for good.\n\n## Restore\n\nOpen the trash and choose Restore to bring a note back before it expires.\n",
    "shortcuts.md": "# Shortcuts\n\nPress Ctrl+K to open the command palette from anywhere in the app.\n",
    "export.md": "# Export\n\nExport a notebook as Markdown or PDF from its menu; attachments come in a zip file.\n",
}

CRASH_UPDATE = {"retention.md": CRASH_V1["retention.md"].replace("thirty days", "ninety days")}
CRASH_QUERY = "How long do deleted notes stay in the trash?"

BEFORE_ACTIVATION = WRITE_STEPS[: WRITE_STEPS.index("activate")]


def crash_copy(baseline: Path, dest: Path, target: MilvusTarget, encoder: Any) -> tuple[Path, dict[str, str]]:
    """A private copy of the indexed baseline (files and stores), with the update applied to its files.

    The baseline is indexed on the Lite file under its data dir; on a server the copy's leaves go to a
    collection of its own, rebuilt from the copied SQL store (its embedding cache: nothing encoded)."""
    for part in ("docs", "data"):
        shutil.copytree(baseline / part, dest / part)
    write_files(dest / "docs", CRASH_UPDATE)
    env = strata_env(dest / "data")
    if target.on_server:
        copy = target.another()
        with opened(settings_for(env), encoder) as resources:
            report = Rebuilder(resources, copy.settings(dest / "data")).rebuild(CRASH_KB)
        assert report.verified and report.encoded == 0
        env.update(copy.env())
    return dest / "docs", env
