"""Retrieval strategies by name (pure): what each one searches and how it shapes the evidence.

- ``basic``: the dense route only, leaves as found;
- ``hybrid``: dense + BM25 fused by RRF, leaves as found;
- ``auto_merge`` (default): hybrid, then two rounds of auto-merge (L3→L2→L1);
  ``STRATA_RETRIEVAL__ROUTES`` / ``__MERGE_ENABLED`` still tune it;
- ``fusion``: several query variants (given by the caller, or made from the
  synonym dictionary), each searched like ``auto_merge``'s first step, fused
  by N-list RRF, then auto-merged;
- ``adjacent``: hybrid, then consecutive hit leaves of one document joined
  into one passage instead of being replaced by their whole parent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, Sequence

from strata.rag.expansion import SynonymDictionary

STRATEGIES = ("basic", "hybrid", "auto_merge", "fusion", "adjacent")
Merge = Literal["parents", "adjacent", "none"]


@dataclass(frozen=True)
class StrategyPlan:
    name: str
    routes: str
    merge: Merge
    multi_query: bool = False


def plan_for(name: str, *, routes: str = "hybrid", merge_enabled: bool = True) -> StrategyPlan:
    """The plan of strategy ``name``; ``routes``/``merge_enabled`` are the settings ``auto_merge`` honours."""
    parents: Merge = "parents" if merge_enabled else "none"
    plans = {
        "basic": StrategyPlan("basic", "dense", "none"),
        "hybrid": StrategyPlan("hybrid", "hybrid", "none"),
        "auto_merge": StrategyPlan("auto_merge", routes, parents),
        "fusion": StrategyPlan("fusion", routes, parents, multi_query=True),
        "adjacent": StrategyPlan("adjacent", "hybrid", "adjacent"),
    }
    if name not in plans:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return plans[name]


def query_variants(
    query: str, *, given: Sequence[str] | None = None, synonyms: SynonymDictionary | None = None, limit: int = 4
) -> tuple[str, ...]:
    """The query first, then up to ``limit - 1`` variants: the caller's, or the query with one
    dictionary term replaced by each of its synonyms."""
    variants = [query]
    if given:
        variants.extend(v for v in given if isinstance(v, str) and v.strip())
    elif synonyms:
        variants.extend(_synonym_variants(query, synonyms))
    unique = list(dict.fromkeys(v.strip() for v in variants))
    return tuple(unique[:limit])


def _synonym_variants(query: str, synonyms: SynonymDictionary) -> list[str]:
    out = []
    for group in synonyms.groups:
        present = next((m for m in group if m.casefold() in query.casefold()), None)
        if present is None:
            continue
        pattern = re.compile(re.escape(present), re.IGNORECASE)
        out.extend(pattern.sub(other, query, count=1) for other in group if other.casefold() != present.casefold())
    return out
