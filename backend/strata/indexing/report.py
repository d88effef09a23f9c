"""What an indexing run reports: progress while it works and the final report."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

logger = logging.getLogger(__name__)


class Progress(Protocol):
    """What the pipeline reports while it works (a tqdm bar, log lines, nothing)."""

    def files_planned(self, total: int) -> None: ...

    def file_done(self, source: str, outcome: str, chunks: int) -> None: ...

    def leaves_encoded(self, count: int) -> None: ...

    def leaves_written(self, source: str, written: int, total: int) -> None:
        """After each batch of leaves upserted: ``written`` of the ``total`` leaves of ``source`` so far."""


class NoProgress:
    def files_planned(self, total: int) -> None:
        return None

    def file_done(self, source: str, outcome: str, chunks: int) -> None:
        return None

    def leaves_encoded(self, count: int) -> None:
        return None

    def leaves_written(self, source: str, written: int, total: int) -> None:
        return None


@dataclass
class IndexReport:
    """The outcome of one ``strata index`` run (also its ``--json`` output)."""

    kb: str
    dry_run: bool = False
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    failed: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    passages_encoded: int = 0
    embeddings_reused: int = 0
    leaves_kept: int = 0  # leaves of resumed versions that Milvus held already (not written again)
    chunks_written: int = 0
    leaves_written: int = 0
    seconds: float = 0.0
    encode_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def chunks_per_s(self) -> float:
        return self.chunks_written / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        data = dict(self.__dict__.items())
        data["chunks_per_s"] = round(self.chunks_per_s, 2)
        data["seconds"] = round(self.seconds, 3)
        data["encode_seconds"] = round(self.encode_seconds, 3)
        return data


def record_failure(report: IndexReport, source: str, reason: str) -> None:
    """One file (or path) that could not be indexed, logged and listed in the report."""
    logger.warning("failed: %s: %s", source, reason)
    report.failed += 1
    report.failures.append({"source": source, "reason": reason})
