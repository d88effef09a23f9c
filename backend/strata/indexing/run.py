"""One indexing run's context (``IndexRun``) and its write steps (``WriteStep``).

The steps are named once, here: the crash tests kill the process right after each
(``tests/kill_at_launcher.py``), by these names, and the lease's fence is checked
there. Each step is passed at one place in the indexing code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from strata.indexing.report import IndexReport, Progress


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
    it reads or decides anything more). An encoder batch writes nothing the fence guards, so it is not fenced."""

    fences: Callable[[], None]
    after_write_step: Callable[[str], None] | None = None

    def __call__(self, step: WriteStep) -> None:
        if self.after_write_step is not None:
            self.after_write_step(step.value)
        if step is not WriteStep.ENCODER_BATCH:
            self.fences()


@dataclass(frozen=True)
class IndexRun:
    """What every step of one run into one kb shares: the kb, the report it fills, the progress it tells and
    the checkpoint it passes after each write step."""

    kb_id: str
    report: IndexReport
    progress: Progress
    checkpoint: Checkpoint
