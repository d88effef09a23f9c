"""``python -m tests.kill_at_launcher STEP ARGS...``: ``strata ARGS...`` that SIGKILLs itself right after STEP.

With ``STRATA_TEST_STEP_SIGNAL=SIGSTOP`` in its environment it stops itself there instead (Ctrl-Z, a long GC,
a stalled host): the fencing tests let another writer take the kb, then continue it with SIGCONT.

The crash tests' launcher: it installs the indexer's ``after_write_step`` seam
in this process, then runs the ``strata`` command as the installed script does.
STEP names a write step of ``strata.indexing.pipeline`` (``WRITE_STEPS``,
``ENCODER_BATCH``); ``STEP:N`` kills right after the N-th time the run passes it.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from strata import cli
from strata.indexing import pipeline

logger = logging.getLogger(__name__)


def kill_at(wanted: str) -> Callable[[str], None]:
    """An ``after_write_step`` that kills (or stops) the process at ``wanted`` (``step`` or ``step:n``)."""
    passed: Counter[str] = Counter()
    signum = signal.Signals[os.environ.get("STRATA_TEST_STEP_SIGNAL", "SIGKILL")]

    def after_write_step(step: str) -> None:
        passed[step] += 1
        if wanted in (step, f"{step}:{passed[step]}"):
            logger.warning("sending %s to the indexer after %s", signum.name, wanted)
            os.kill(os.getpid(), signum)

    return after_write_step


def install(wanted: str) -> None:
    """Every ``Indexer`` this process builds (the command builds its own) gets the killing seam."""
    build = pipeline.Indexer.__init__

    @functools.wraps(build)
    def build_killing(self: pipeline.Indexer, *args: Any, **kwargs: Any) -> None:
        build(self, *args, after_write_step=kill_at(wanted), **kwargs)

    pipeline.Indexer.__init__ = build_killing  # type: ignore[method-assign]


if __name__ == "__main__":
    install(sys.argv[1])
    sys.exit(cli.main(sys.argv[2:]))
