"""strata's retrieval strategies: the one table every list of them is read from.

The setting ``STRATA_RETRIEVAL__STRATEGY`` (its type), the API's ``strategy``
enum, ``strata query --strategy``'s choices, the console's list (``GET
/ui/strategies``), the retriever registry, the planner
(``strata.rag.strategy_plan.plan_for``) and ``strata eval --modes`` all derive
from ``STRATEGIES``. The table lives in this pure module (it imports only ``strata.errors``)
rather than in ``strata.rag`` because ``strata.config``, which imports nothing
else of strata, types its setting with it and must not import the engine.

What a strategy fixes, and which settings still tune it (``None`` below = the
setting decides):

============  ==========================  ====================================  ==============
strategy      routes                      merge                                 query variants
============  ==========================  ====================================  ==============
basic         dense (fixed)               none (fixed)                          no
hybrid        hybrid: dense + BM25, RRF   none (fixed)                          no
auto_merge    ``retrieval.routes``        parents; none if ``merge_enabled``    no
                                          is false
fusion        ``retrieval.routes``        as ``auto_merge``                     up to ``fusion_max_variants``
adjacent      hybrid (fixed)              adjacent leaves joined (fixed)        no
============  ==========================  ====================================  ==============

A strategy whose name says its routes or its merging fixes them: ``routes`` and
``merge_enabled`` are the tuning knobs of ``auto_merge`` and ``fusion`` only.
So ``auto_merge`` with ``routes=dense`` and merging off searches as ``basic``
does (``meta.strategy`` still says ``auto_merge``): the settings tune the
default; to ask for another search, name the strategy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Literal

from strata.errors import InvalidArgumentError

Routes = Literal["hybrid", "dense", "sparse"]
Merge = Literal["parents", "adjacent", "none"]


@dataclass(frozen=True)
class Strategy:
    """One row: ``routes``/``merge`` ``None`` means the setting (``retrieval.routes`` / ``merge_enabled``) decides."""

    name: str
    summary: str
    routes: Routes | None
    merge: Merge | None
    multi_query: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


STRATEGIES: Mapping[str, Strategy] = MappingProxyType(
    {
        s.name: s
        for s in (
            Strategy("basic", "the dense route only, leaves as found", routes="dense", merge="none"),
            Strategy("hybrid", "dense + BM25 fused by RRF, leaves as found", routes="hybrid", merge="none"),
            Strategy("auto_merge", "hybrid, then two rounds of auto-merge (L3 → L2 → L1)", routes=None, merge=None),
            Strategy(
                "fusion",
                "several query variants searched and fused (N-list RRF), then auto-merged",
                routes=None,
                merge=None,
                multi_query=True,
            ),
            Strategy(
                "adjacent",
                "hybrid, then consecutive hit leaves of one document joined into one passage",
                routes="hybrid",
                merge="adjacent",
            ),
        )
    }
)
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGIES)
DEFAULT_STRATEGY = "auto_merge"
# the console's compare view opens on the default against the search it merges
COMPARE_PAIR = ("hybrid", DEFAULT_STRATEGY)

# a runtime Literal of the names: pydantic (settings, the API schema) validates it and OpenAPI shows it as an enum
StrategyName = Literal[STRATEGY_NAMES]  # type: ignore[valid-type]


def strategy(name: str) -> Strategy:
    """The row of ``name``; ``InvalidArgumentError`` (a ``ValueError``) naming the choices for an unknown one."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise InvalidArgumentError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGY_NAMES)}") from None
