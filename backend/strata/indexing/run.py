"""One indexing run's context (``IndexRun``) and its write steps (``WriteStep``).

The steps are named once, here: the crash tests kill the process right after each
(``tests/kill_at_launcher.py``), by these names, and the lease's fence is checked
there. Each step is passed at one place in the indexing code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from strata.errors import IndexingStoppedError
from strata.indexing.report import IndexReport, Progress
from strata.types import Chunk


class WriteStep(StrEnum):
    """The write steps in their order (``pipeline``'s module docstring); ``ENCODER_BATCH`` is passed after each
    batch of vectors the encoder made is cached, within ``MILVUS_UPSERT``'s work."""

    SQL_PENDING = "sql_pending"
    MILVUS_UPSERT = "milvus_upsert"
    MILVUS_FLUSH = "milvus_flush"
    ACTIVATE = "activate"
    RETIRE_MILVUS = "retire_milvus"
    RETIRE_SQL = "retire_sql"
    ENCODER_BATCH = "encoder_batch"


WRITE_STEPS: tuple[str, ...] = tuple(step.value for step in WriteStep if step is not WriteStep.ENCODER_BATCH)
ENCODER_BATCH: str = WriteStep.ENCODER_BATCH.value


@dataclass(frozen=True)
class Checkpoint:
    """Passed after each write step: the crash tests' seam (``after_write_step``, called with the step's name),
    then the lease's fence (``fences``: a run paused past its lease stops here, with ``LeaseLostError``, before
    it reads or decides anything more). An encoder batch writes nothing the fence guards, so it is not fenced.

    Then the stop (``stop``, set by ``Indexer.stop`` when the service shuts down): a run stops here with
    ``IndexingStoppedError``, at the batch boundary, not at the end of its document. Every step is one a crash
    may follow (the crash tests kill the process at each), so what the run wrote is left as a crash leaves it:
    a pending version that never served, which the next run of the same file continues."""

    fences: Callable[[], None]
    after_write_step: Callable[[str], None] | None = None
    stop: threading.Event | None = None

    def __call__(self, step: WriteStep) -> None:
        if self.after_write_step is not None:
            self.after_write_step(step.value)
        if step is not WriteStep.ENCODER_BATCH:
            self.fences()
        if self.stop is not None and self.stop.is_set():
            raise IndexingStoppedError(
                f"indexing stopped after a batch ({step.value}): the service is shutting down; what was written "
                "is kept and the next upload of the same files continues it"
            )


class RunWrites:
    """What one run wrote outside SQL, by version: the versions whose leaves it upserted and the chunks it
    cached. Its one owner is the writer, which records a write before making it; a run that loses its lease
    withdraws exactly these (``Indexer``): a late write of its own then leaves nothing behind."""

    def __init__(self) -> None:
        self.versions: set[tuple[str, int]] = set()  # (doc id, version) with leaves upserted
        self.cached: dict[tuple[str, int], list[str]] = {}  # (doc id, version) -> chunk ids cached

    def writing(self, chunks: Sequence[Chunk], *, cached: bool = True) -> None:
        """``chunks`` are about to be written: leaves to Milvus, parents to the cache (``cached``: a cache other
        processes read; a process's own is not written at indexing)."""
        for chunk in chunks:
            if chunk.is_leaf:
                self.versions.add((chunk.doc_id, chunk.version))
            elif cached:
                self.cached.setdefault((chunk.doc_id, chunk.version), []).append(chunk.chunk_id)


@dataclass(frozen=True)
class IndexRun:
    """What every step of one run into one kb shares: the kb, the report it fills, the progress it tells and
    the checkpoint it passes after each write step."""

    kb_id: str
    report: IndexReport
    progress: Progress
    checkpoint: Checkpoint
    writes: RunWrites = field(default_factory=RunWrites)
