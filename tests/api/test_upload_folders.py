"""Upload folders of a killed worker are removed; a live process's, another user's and foreign ones are not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from strata.api.uploads import FOLDER_PREFIX, remove_orphaned_folders


def test_only_the_folders_of_processes_that_no_longer_run_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    assert gone.wait(timeout=60) == 0
    live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        folders = {
            "dead": tmp_path / f"{FOLDER_PREFIX}{gone.pid}-abc",
            "live": tmp_path / f"{FOLDER_PREFIX}{live.pid}-def",
            "own": tmp_path / f"{FOLDER_PREFIX}{os.getpid()}-ghi",
            "no pid": tmp_path / f"{FOLDER_PREFIX}xyz",
            "other": tmp_path / f"unrelated-{gone.pid}-jkl",
        }
        for folder in folders.values():
            (folder / "sub").mkdir(parents=True)
            (folder / "sub" / "doc.md").write_text("# Doc\n", encoding="utf-8")
        removed = remove_orphaned_folders(tmp_path)
    finally:
        live.communicate(timeout=30)
    assert removed == [folders["dead"]]
    assert {name for name, folder in folders.items() if folder.exists()} == {"live", "own", "no pid", "other"}
