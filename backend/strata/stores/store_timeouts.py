"""Which bound ends a store call, and the one wording of a store call that ran out of it.

A store call waits at most the tightest of its setting (``STRATA_DATABASE__CALL_TIMEOUT_S``,
``STRATA_MILVUS__COUNT_TIMEOUT_S``, ...) and, on a request's path, what is left of the request's deadline.
``bound`` picks it; ``timed_out`` words the ``StoreTimeoutError`` of a call that ran out, naming the store and
the setting (or the deadline) that ended it, never a driver's own words alone (psycopg's
``ConnectionTimeout``, gRPC's ``DEADLINE_EXCEEDED``). Every store adapter translates its library's timeouts
here, at its one translation point.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from strata.config import MilvusSettings
from strata.errors import StoreTimeoutError

REQUEST_DEADLINE = "the request's deadline: deadline_ms, at most STRATA_RETRIEVAL__DEADLINE_MS"


@dataclass(frozen=True)
class Bound:
    """How long a call may wait, and the setting that says so."""

    seconds: float
    setting: str


def bound(configured_s: float, setting: str, left: Bound | None = None) -> Bound:
    """The tighter of a setting's ``configured_s`` and what is ``left`` of an enclosing bound (a request's
    deadline, a probe's; None: none)."""
    if left is not None and left.seconds < configured_s:
        return Bound(max(0.0, left.seconds), left.setting)
    return Bound(configured_s, setting)


def milvus_bound(timeout_s: float, settings: MilvusSettings) -> Bound:
    """The bound of a Milvus call given ``timeout_s``: the setting whose value it is, else the request's
    deadline (which cut it below them)."""
    named = {
        "STRATA_MILVUS__SEARCH_TIMEOUT_S": settings.search_timeout_s,
        "STRATA_MILVUS__TIMEOUT_S": settings.timeout_s,
        "STRATA_MILVUS__COUNT_TIMEOUT_S": settings.count_timeout_s,
        "STRATA_MILVUS__FLUSH_TIMEOUT_S": settings.flush_timeout_s,
    }
    for setting, value in named.items():
        if timeout_s == value:
            return Bound(timeout_s, setting)
    return Bound(timeout_s, REQUEST_DEADLINE)


def timed_out(store: str, call: str, limit: Bound, *, address: str = "") -> StoreTimeoutError:
    """The error of a ``call`` to ``store`` that waited out ``limit``."""
    at = f" at {address}" if address else ""
    return StoreTimeoutError(
        f"{store}{at} did not answer {call} within {limit.seconds:.3g} s ({limit.setting}): "
        "is the server paused, partitioned or overloaded?",
        store=store,
        setting=limit.setting,
        timeout_s=limit.seconds,
    )


def is_grpc_deadline(exc: BaseException) -> bool:
    """Whether a pymilvus or gRPC error is a call's deadline running out (pymilvus lets some out raw)."""
    code = getattr(exc, "code", None)
    if isinstance(exc, grpc.RpcError) and callable(code) and code() == grpc.StatusCode.DEADLINE_EXCEEDED:
        return True
    text = str(exc)
    if "wait for flush timeout" in text or "Retry timeout" in text:  # pymilvus's own waits on a call's timeout
        return True
    return "DEADLINE_EXCEEDED" in text or "Deadline Exceeded" in text or "deadline exceeded" in text.lower()
