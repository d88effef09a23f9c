"""What an indexing run reports: progress while it works and the final report.

``IndexReport`` owns its counts and lists: the run's steps tell it what happened (``file_failed``,
``document_written``, ...) and only its methods change a field, so each count has one definition.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NamedTuple, Protocol, assert_never

from pydantic import PlainSerializer, computed_field

from strata.indexing.plan import IndexPlan, WriteOutcome
from strata.wire import WIRE, to_json

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


def _rounded(places: int) -> PlainSerializer:
    return PlainSerializer(lambda value: round(value, places), return_type=float)


@dataclass
class IndexReport:
    """The outcome of one indexing run: ``strata index --json``'s output and the upload route's answer.

    This class is its one definition: its JSON (``to_dict``, ``strata.wire``), the service's answer and the
    OpenAPI schema come from these fields."""

    __pydantic_config__ = WIRE

    kb: str
    """the knowledge base indexed"""
    dry_run: bool = False
    """true: the counts say what a run would do; nothing was written"""
    added: int = 0
    """documents indexed for the first time"""
    updated: int = 0
    """documents indexed as a new version"""
    unchanged: int = 0
    """documents whose indexed version was kept"""
    deleted: int = 0
    """documents deleted"""
    failed: int = 0
    """files (or paths) that could not be indexed; each keeps its indexed version"""
    failures: list[dict[str, str]] = field(default_factory=list)
    """each failed file: its ``source`` and the ``reason``"""
    skipped: list[dict[str, str]] = field(default_factory=list)
    """entries not indexed on purpose (an unsupported type, a symlinked folder): ``source`` and ``reason``"""
    warnings: list[dict[str, str]] = field(default_factory=list)
    """notes on files that were read (an unresolved include, markup the parser refused): ``source`` and ``note``"""
    passages_encoded: int = 0
    """leaf texts the encoder encoded"""
    embeddings_reused: int = 0
    """leaf texts whose vector the kb's embedding cache held"""
    leaves_kept: int = 0
    """leaves of resumed versions that Milvus held already (not written again)"""
    chunks_written: int = 0
    """chunk rows written (every level)"""
    leaves_written: int = 0
    """leaves written to Milvus"""
    seconds: Annotated[float, _rounded(3)] = 0.0
    """the run's duration"""
    encode_seconds: Annotated[float, _rounded(3)] = 0.0
    """time spent encoding"""
    notes: list[str] = field(default_factory=list)
    """what the run noticed beside its counts (a refusal a dry run would meet, a resumed version, ...)"""

    @computed_field(description="chunks written per second of the run (rounded to 2 places)")  # type: ignore[prop-decorator]
    @property
    def chunks_per_s(self) -> float:
        return round(self.chunks_written / self.seconds, 2) if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (``strata.wire``): its fields, then ``chunks_per_s``."""
        return to_json(self)

    # -- what the run's steps record: the only writers of the fields above ----------------------------------

    def file_failed(self, source: str, reason: str) -> None:
        """A file (or path) that could not be indexed (it keeps its indexed version), logged and listed."""
        logger.warning("failed: %s: %s", source, reason)
        self.failed += 1
        self.failures.append({"source": source, "reason": reason})

    def file_skipped(self, source: str, reason: str) -> None:
        """An entry not indexed on purpose (an unsupported type, a symlinked folder)."""
        self.skipped.append({"source": source, "reason": reason})

    def file_warnings(self, source: str, notes: Sequence[str]) -> None:
        """A read file's notes (``SourceDocument.notes``; ``load_document`` logged them)."""
        self.warnings.extend({"source": source, "note": note} for note in notes)

    def noted(self, *notes: str) -> None:
        """What the run noticed beside its counts."""
        self.notes.extend(notes)

    def planned(self, plan: IndexPlan) -> None:
        """The plan's documents that keep their indexed version."""
        self.unchanged += len(plan.unchanged)

    def would_write(self, plan: IndexPlan) -> None:
        """A dry run's counts: what writing and deleting ``plan`` would count, each document as
        ``document_written`` would count it (``DocumentPlan.outcome``)."""
        for item in plan.to_write:
            self._count_written(item.outcome)
        self.deleted += len(plan.to_delete)

    def document_written(self, outcome: WriteOutcome, *, chunks: int, leaves: int) -> None:
        """A version written, checked and serving: ``outcome`` is its ``DocumentPlan.outcome``."""
        self._count_written(outcome)
        self.chunks_written += chunks
        self.leaves_written += leaves

    def documents_deleted(self, count: int) -> None:
        self.deleted += count

    def leaves_embedded(self, *, encoded: int, reused: int, kept: int, seconds: float) -> None:
        """A batch of leaves embedded (``embedding.Embedded``): by the encoder, from the embedding cache, or kept
        in Milvus from a resumed version; ``seconds`` spent encoding."""
        self.passages_encoded += encoded
        self.embeddings_reused += reused
        self.leaves_kept += kept
        self.encode_seconds += seconds

    def finished(self, seconds: float) -> None:
        self.seconds = seconds

    def sources_relative_to(self, folder: Path) -> None:
        """Failures, skipped files and warnings under ``folder`` named relative to it (an upload's temporary
        folder means nothing to the caller)."""
        prefix = f"{folder}{os.sep}"
        for entry in (*self.failures, *self.skipped, *self.warnings):
            if entry["source"].startswith(prefix):
                entry["source"] = entry["source"][len(prefix) :]

    def _count_written(self, outcome: WriteOutcome) -> None:
        match outcome:
            case "added":
                self.added += 1
            case "updated":
                self.updated += 1
            case _:
                assert_never(outcome)


class Failure(NamedTuple):
    """A file (or path) that could not be indexed, and why: what ``IndexReport.file_failed`` lists."""

    source: str
    reason: str
