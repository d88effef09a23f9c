"""Retrieval strategies planned (pure): what each one searches and how it shapes the evidence.

The strategies themselves, and which settings each one honours, are the table
of ``strata.strategy_table``; ``plan_for`` turns a row and the settings into a
``StrategyPlan``. ``fusion`` searches several query variants (given by the
caller, or made from the synonym dictionary), each like ``auto_merge``'s first
step, fused by N-list RRF, then auto-merged.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from strata.rag.expansion import SynonymDictionary
from strata.strategy_table import Merge, Routes, strategy


@dataclass(frozen=True)
class StrategyPlan:
    name: str
    routes: Routes
    merge: Merge
    multi_query: bool = False


def plan_for(name: str, *, routes: Routes = "hybrid", merge_enabled: bool = True) -> StrategyPlan:
    """The plan of strategy ``name``; ``routes``/``merge_enabled`` apply where its row leaves them open."""
    row = strategy(name)
    merge: Merge = row.merge or ("parents" if merge_enabled else "none")
    return StrategyPlan(row.name, row.routes or routes, merge, multi_query=row.multi_query)


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
    out: list[str] = []
    for group in synonyms.groups:
        present = next((m for m in group if m.casefold() in query.casefold()), None)
        if present is None:
            continue
        pattern = re.compile(re.escape(present), re.IGNORECASE)
        out.extend(pattern.sub(other, query, count=1) for other in group if other.casefold() != present.casefold())
    return out
