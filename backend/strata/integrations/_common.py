"""What both adapters share: running a registered retriever and shaping document metadata."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from strata.config import get_settings
from strata.errors import InvalidArgumentError
from strata.rag.registry import get_retriever
from strata.types import Filters, RetrievalResult, RetrievedDocument

if TYPE_CHECKING:
    from strata.rag.retrieve import Retriever

META_KEY = "strata_meta"
"""The metadata key under which every returned document carries the call's meta record (one dict, shared)."""

ResultCallback = Callable[[RetrievalResult], None]


@dataclass(frozen=True)
class RetrievalCall:
    """One adapter's configuration: which retriever, on which engine, over which kbs and filters, how many results.

    ``engine`` is the ``strata.rag.retrieve.Retriever`` strata's strategies run on; None means
    ``default_engine()`` (the environment's settings), as ``retrieve_documents`` would use.
    ``strategy`` None means the configured one (``STRATA_RETRIEVAL__STRATEGY`` of the engine's settings).
    """

    strategy: str | None = None
    kb_ids: Sequence[str] | None = None
    filters: Filters | None = None
    top_k: int = 5
    engine: Retriever | None = None
    on_result: ResultCallback | None = None

    def run(self, query: str) -> RetrievalResult:
        """The registered retriever's result for ``query``; ``on_result`` sees it first (even when empty)."""
        config = {"engine": self.engine} if self.engine is not None else {}
        scope = {
            name: value for name, value in (("kb_ids", self.kb_ids), ("filters", self.filters)) if value is not None
        }
        result = get_retriever(self.retriever_name(), **config).retrieve(query, self.top_k, **scope)
        if self.on_result is not None:
            self.on_result(result)
        return result

    def retriever_name(self) -> str:
        """The registered retriever this call runs: the given strategy, or the configured one."""
        if self.strategy is not None:
            return self.strategy
        settings = self.engine.settings if self.engine is not None else get_settings()  # default_engine()'s
        return settings.retrieval.strategy


def as_filters(value: Filters | Mapping[str, Any] | None) -> Filters | None:
    """``Filters`` from a ``Filters`` or a plain dict (``{"modules": ["billing"]}``).

    An unknown key is refused: a misspelt filter must not silently widen the search.
    """
    if value is None or isinstance(value, Filters):
        return value
    known = {f.name for f in fields(Filters)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise InvalidArgumentError(f"unknown filter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {name: _as_tuple(v) if name != "source_prefix" else v for name, v in value.items()}
    return Filters(**values)


def _as_tuple(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def document_metadata(doc: RetrievedDocument, meta: dict[str, Any]) -> dict[str, Any]:
    """strata's metadata of ``doc`` (heading path, source, level, merged_from, trace, ...), its score and the meta record."""
    return {**doc.metadata, "score": doc.score, META_KEY: meta}
