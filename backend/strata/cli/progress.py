"""Progress of long jobs: a tqdm bar on a terminal, plain log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time

from strata.indexing.report import NoProgress

logger = logging.getLogger("strata.progress")


class BarProgress:
    """Two tqdm bars: files, and leaves encoded (with their rate)."""

    def __init__(self) -> None:
        from tqdm import tqdm

        self._files = tqdm(total=0, unit="file", desc="files", position=0, dynamic_ncols=True)
        self._leaves = tqdm(total=None, unit="leaf", desc="encoded", position=1, dynamic_ncols=True)
        self._chunks = 0

    def files_planned(self, total: int) -> None:
        self._files.total = total
        self._files.refresh()

    def file_done(self, source: str, outcome: str, chunks: int) -> None:
        self._chunks += chunks
        elapsed = max(self._files.format_dict.get("elapsed", 0.0), 1e-9)
        self._files.set_postfix(chunks=self._chunks, chunks_per_s=f"{self._chunks / elapsed:.1f}", refresh=False)
        self._files.update(1)

    def leaves_encoded(self, count: int) -> None:
        self._leaves.update(count)

    def leaves_written(self, source: str, written: int, total: int) -> None:
        if written < total:  # within a large document: where it is
            self._files.set_postfix_str(f"{source}: {written}/{total} leaves written")

    def close(self) -> None:
        self._leaves.close()
        self._files.close()


class LogProgress:
    """One log line every ``every_s`` seconds and at the end."""

    def __init__(self, every_s: float = 10.0) -> None:
        self._every = every_s
        self._started = self._last = time.monotonic()
        self._total = self._files = self._chunks = self._leaves = 0
        self._within = ""  # the document being written, while it takes more than one batch

    def files_planned(self, total: int) -> None:
        self._total = total
        logger.info("%d files to process", total)

    def file_done(self, source: str, outcome: str, chunks: int) -> None:
        self._files += 1
        self._chunks += chunks
        logger.debug("%s: %s (%d chunks)", source, outcome, chunks)
        self._maybe_log()

    def leaves_encoded(self, count: int) -> None:
        self._leaves += count
        self._maybe_log()

    def leaves_written(self, source: str, written: int, total: int) -> None:
        self._within = f"; {source}: {written}/{total} leaves written" if written < total else ""
        self._maybe_log()

    def _maybe_log(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last >= self._every:
            self._last = now
            rate = self._chunks / max(now - self._started, 1e-9)
            logger.info(
                "files %d/%d, leaves encoded %d, chunks written %d (%.1f chunks/s)%s",
                self._files,
                self._total,
                self._leaves,
                self._chunks,
                rate,
                self._within,
            )

    def close(self) -> None:
        self._maybe_log(force=True)


class SilentProgress(NoProgress):
    def close(self) -> None:
        return None


def make_progress(*, enabled: bool = True) -> BarProgress | LogProgress | SilentProgress:
    """A bar on an interactive stderr, log lines when piped, nothing when disabled."""
    if not enabled:
        return SilentProgress()
    return BarProgress() if sys.stderr.isatty() else LogProgress()
