"""A per-request deadline: every stage gets what is left of one time budget.

``STRATA_RETRIEVAL__DEADLINE_MS`` (default 2,500) bounds a whole
``retrieve`` call. Stages ask ``remaining()`` and pass it on as their own
timeout (Milvus calls, the PostgreSQL statement timeout, the rerank request,
the wait for the encoder); a stage that finds nothing left raises
``strata.errors.DeadlineExceeded``, is skipped with the reason
``deadline_exceeded`` and its fallback (or a ``failed`` answer) takes over. A
call therefore outlives its deadline by at most one socket timeout.
"""

from __future__ import annotations

import time


class Deadline:
    """The time left of a budget started at construction."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s = budget_s
        self._ends = time.monotonic() + budget_s

    def remaining(self) -> float:
        """Seconds left (never below zero)."""
        return max(0.0, self._ends - time.monotonic())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def within(self, limit_s: float, *, keep_s: float = 0.0) -> float:
        """A stage's timeout: its own ``limit_s``, cut to what is left minus ``keep_s`` for the stages after it."""
        return max(0.0, min(limit_s, self.remaining() - keep_s))
