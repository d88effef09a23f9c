"""The client's batches of an upload: bounded in files and bytes, in order, none empty; reports added up."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.upload_batches import added_up, halves, upload_batches

pytestmark = [pytest.mark.unit]


def _files(tmp_path: Path, sizes: list[int]) -> list[tuple[str, Path]]:
    named = []
    for n, size in enumerate(sizes):
        path = tmp_path / f"f{n}.md"
        path.write_bytes(b"x" * size)
        named.append((path.name, path))
    return named


def test_batches_hold_at_most_the_files_and_bytes_given_in_order(tmp_path: Path) -> None:
    files = _files(tmp_path, [10, 10, 10, 10, 10, 50, 10])
    batches = upload_batches(files, max_files=3, max_bytes=40)
    assert [[name for name, _ in batch] for batch in batches] == [
        ["f0.md", "f1.md", "f2.md"],
        ["f3.md", "f4.md"],
        ["f5.md"],  # larger than max_bytes: alone
        ["f6.md"],
    ]
    assert [named for batch in batches for named in batch] == files
    assert upload_batches([], max_files=3, max_bytes=40) == []


def test_halves_split_a_refused_batch_and_reports_add_up(tmp_path: Path) -> None:
    files = _files(tmp_path, [1, 1, 1])
    assert halves(files) == [files[:1], files[1:]]
    one = {"kb": "k", "dry_run": False, "added": 2, "seconds": 1.0, "chunks_written": 6, "failures": [{"a": 1}]}
    two = {"kb": "k", "dry_run": False, "added": 3, "seconds": 2.0, "chunks_written": 6, "failures": []}
    total = added_up([one, two])
    assert (total["added"], total["seconds"], total["chunks_per_s"], total["failures"]) == (5, 3.0, 4.0, [{"a": 1}])
    assert total["kb"] == "k" and total["dry_run"] is False
