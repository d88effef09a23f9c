"""How the client sends an upload of any size: requests of a bounded number of files and bytes.

The service takes at most ``MAX_FILES`` files a request (``strata.api.uploads``) and a body of
``STRATA_API__MAX_UPLOAD_BYTES``; a folder of more is sent in several requests, each one run of
the service's indexer (a document is written or not, whole). Only the last request deletes: it carries
``delete_missing`` and, in its ``present`` part, the names of every file of the folder sent before, so the
deletion is computed from the complete list the client holds, after every file was indexed. The reports
of the requests are added up into one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

UPLOAD_FILES = 1000  # files a request: the service's MAX_FILES (its `present` part is allowed beside them)
UPLOAD_BYTES = 8 * 2**20  # file bytes a request: well inside the service's default body limit (20 MiB)

Named = tuple[str, Path]  # (the name sent, the local file)


def upload_batches(
    files: Sequence[Named], *, max_files: int | None = None, max_bytes: int | None = None
) -> list[list[Named]]:
    """``files`` in order, in batches of at most ``max_files`` files and ``max_bytes`` bytes (default
    ``UPLOAD_FILES`` and ``UPLOAD_BYTES``; a larger file alone); never an empty batch."""
    max_files, max_bytes = max_files or UPLOAD_FILES, max_bytes or UPLOAD_BYTES
    batches: list[list[Named]] = []
    batch: list[Named] = []
    size = 0
    for named in files:
        length = _size(named[1])
        if batch and (len(batch) >= max_files or size + length > max_bytes):
            batches.append(batch)
            batch, size = [], 0
        batch.append(named)
        size += length
    if batch:
        batches.append(batch)
    return batches


def halves(batch: Sequence[Named]) -> list[list[Named]]:
    """A batch the service found too large, as two (it has a lower limit than this client assumes)."""
    middle = len(batch) // 2
    return [list(batch[:middle]), list(batch[middle:])]


def added_up(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One report of several: counts and seconds added, lists joined, the rest of the first report."""
    total: dict[str, Any] = dict(reports[0]) if reports else {}
    for report in reports[1:]:
        for key, value in report.items():
            if isinstance(value, list) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
                total[key] = total.get(key, type(value)()) + value
    seconds = total.get("seconds", 0)
    if reports:
        total["chunks_per_s"] = round(total.get("chunks_written", 0) / seconds, 2) if seconds else 0.0
    return total


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:  # read when it is sent: the error is reported then
        return 0
