"""What both adapters share: running a registered retriever and shaping document metadata."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from backend.config import Settings
from backend.rag.registry import DEFAULT_STRATEGY, get_retriever
from backend.types import Filters, RetrievalResult, RetrievedDocument

META_KEY = "strata_meta"
"""The metadata key under which every returned document carries the call's meta record (a dict)."""

ResultCallback = Callable[[RetrievalResult], None]


@dataclass(frozen=True)
class RetrievalCall:
    """One adapter's configuration: which retriever, over which kbs and filters, how many results."""

    strategy: str = DEFAULT_STRATEGY
    kb_ids: Sequence[str] | None = None
    filters: Filters | None = None
    top_k: int = 5
    settings: Settings | None = None
    engine: Any = None
    on_result: ResultCallback | None = None

    def run(self, query: str) -> RetrievalResult:
        """The registered retriever's result for ``query``; ``on_result`` sees it first (even when empty)."""
        config = {name: value for name, value in (("settings", self.settings), ("engine", self.engine)) if value is not None}
        scope = {name: value for name, value in (("kb_ids", self.kb_ids), ("filters", self.filters)) if value is not None}
        result = get_retriever(self.strategy, **config).retrieve(query, self.top_k, **scope)
        if self.on_result is not None:
            self.on_result(result)
        return result


def document_metadata(doc: RetrievedDocument, meta: dict[str, Any]) -> dict[str, Any]:
    """strata's metadata of ``doc`` (heading path, source, level, merged_from, trace, ...), its score and the meta record."""
    return {**doc.metadata, "score": doc.score, META_KEY: meta}
