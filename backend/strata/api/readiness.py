"""Readiness: a status per component (Milvus, SQL, Redis, reranker, encoder).

Milvus and SQL are required (either down = not ready, 503); Redis, the
reranker and the encoder only cost speed or quality when down (``degraded``,
still 200): retrieval falls back and says so in its meta record.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from strata.api.service import Service

REQUIRED = ("milvus", "sql")


def check_components(service: Service) -> dict[str, dict[str, Any]]:
    res = service.resources
    components = {
        "sql": _timed(lambda: len(res.documents.list_kbs()) >= 0),
        "milvus": _timed(lambda: _milvus(service)),
        "redis": _timed(lambda: _redis(service)),
        "reranker": _timed(lambda: _reranker(service)),
        "encoder": _timed(lambda: res.encoder.encode_queries(["ready"]).shape[0] == 1),
    }
    components["encoder"]["name"] = getattr(res.__dict__.get("encoder"), "name", None)
    return components


def overall(components: dict[str, dict[str, Any]]) -> tuple[str, int]:
    """``ready``/``degraded`` (200) or ``unavailable`` (503)."""
    if any(components[name]["status"] == "down" for name in REQUIRED):
        return "unavailable", 503
    if any(c["status"] == "down" for c in components.values()):
        return "degraded", 200
    return "ready", 200


def _milvus(service: Service) -> bool:
    kbs = service.resources.documents.list_kbs()
    index = service.resources.leaf_index  # opened once; says nothing of the server now
    # one real call every time, kbs or none: a kb's count, or the listing that finds no such kb
    index.count(kbs[0].kb_id if kbs else "__ready__")
    return True


def _redis(service: Service) -> bool | None:
    if not service.settings.redis.url:
        return None
    service.resources.parents.cache.get_many([("__ready__", "__ready__")])
    return True


def _reranker(service: Service) -> bool | None:
    reranker = service.reranker
    if reranker is None:
        return None
    reranker.rerank("ready", ["ready"])
    return True


def _timed(check: Callable[[], bool | None]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        outcome = check()
    except Exception as exc:
        return {"status": "down", "error": f"{type(exc).__name__}: {exc}"[:300], "ms": _ms(started)}
    return {"status": "not_configured" if outcome is None else "ok", "ms": _ms(started)}


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 2)
