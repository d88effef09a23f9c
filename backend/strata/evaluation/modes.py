"""``strata eval``'s modes (pure): the strategies by name, and the docs/evaluation.md §8 rows.

A mode is a strategy of ``strata.strategy_table`` plus retrieval settings.
Every strategy is a mode under its own name; the rows docs/evaluation.md §8 and the
recorded results in docs/benchmarks.md and docs/evaluation.md name keep their names as
strata's default strategy with its routes and merging switched:

- ``bm25``: the BM25 route only, no merge; ``dense``: the dense route only, no
  merge (what the ``basic`` strategy searches);
- ``hybrid+merge``: the default path without rerank; ``full``: with rerank
  (only when ``STRATA_RERANK__URL`` is set).

Every mode starts from the same retrieval settings (``BASELINE``: both routes,
merging on) and, except ``full``, without rerank, so a mode measures its
strategy rather than the caller's tuning of routes and merging.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from strata.config import ConfigError
from strata.strategy_table import DEFAULT_STRATEGY, STRATEGY_NAMES


@dataclass(frozen=True)
class EvalMode:
    strategy: str
    retrieval: Mapping[str, Any] = field(default_factory=dict)
    rerank: bool = False

    def overrides(self) -> dict[str, Any]:
        """The settings overrides of this mode (for ``strata.config.with_overrides``)."""
        retrieval = {**BASELINE, "strategy": self.strategy, **self.retrieval}
        return {"retrieval": retrieval} if self.rerank else {"retrieval": retrieval, "rerank": {"url": ""}}


BASELINE: Mapping[str, Any] = MappingProxyType({"routes": "hybrid", "merge_enabled": True})
SPEC_ROWS: Mapping[str, EvalMode] = MappingProxyType(
    {
        "bm25": EvalMode(DEFAULT_STRATEGY, {"routes": "sparse", "merge_enabled": False}),
        "dense": EvalMode(DEFAULT_STRATEGY, {"routes": "dense", "merge_enabled": False}),
        "hybrid+merge": EvalMode(DEFAULT_STRATEGY),
        "full": EvalMode(DEFAULT_STRATEGY, rerank=True),
    }
)
MODES: Mapping[str, EvalMode] = MappingProxyType({**{name: EvalMode(name) for name in STRATEGY_NAMES}, **SPEC_ROWS})
# docs/evaluation.md §8's table: the routes alone, fused, merged, reranked
DEFAULT_MODES = ("bm25", "dense", "hybrid", "hybrid+merge", "full")


def eval_mode(name: str) -> EvalMode:
    """The mode ``name``; ``ConfigError`` naming the choices for an unknown one."""
    if name not in MODES:
        raise ConfigError(f"unknown eval mode {name!r}; choose from {', '.join(MODES)}")
    return MODES[name]


def parse_modes(text: str | None) -> list[str]:
    """``--modes`` (comma-separated; ``None`` = ``DEFAULT_MODES``), each checked; ``ConfigError`` names unknown ones."""
    modes = [m.strip() for m in text.split(",") if m.strip()] if text is not None else list(DEFAULT_MODES)
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ConfigError(f"unknown --modes {unknown or text!r}; choose from {', '.join(MODES)}")
    return modes
