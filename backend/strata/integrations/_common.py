"""What both adapters share: running a registered retriever (in-process or on a service) and shaping metadata."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING, Any

from strata.client import AsyncStrataClient, StrataClient
from strata.config import get_settings
from strata.errors import InvalidArgumentError
from strata.rag.async_retrieve import run_in_pool
from strata.rag.registry import get_retriever
from strata.types import Filters, RetrievalResult, RetrievedDocument

if TYPE_CHECKING:
    from strata.rag.retrieve import Retriever

META_KEY = "strata_meta"
"""The metadata key under which every returned document carries the call's meta record (one dict, shared)."""

ResultCallback = Callable[[RetrievalResult], None]


@dataclass(frozen=True)
class RetrievalCall:
    """One adapter's configuration: which retriever, on which engine or service, over which kbs and filters, how
    many results.

    ``engine`` is the ``strata.rag.retrieve.Retriever`` strata's strategies run on; None means
    ``default_engine()`` (the environment's settings), as ``retrieve_documents`` would use.
    ``strategy`` None means the configured one (``STRATA_RETRIEVAL__STRATEGY`` of the engine's settings, or of the
    service's). With ``client`` (a ``StrataClient``) a call runs on that service instead, and with ``async_client``
    (an ``AsyncStrataClient``) an awaited one does, holding no thread; on a service ``strategy`` names one of
    strata's strategies. An awaited call without ``async_client`` runs the blocking one in strata's query pool
    (``strata.rag.async_retrieve``).
    """

    strategy: str | None = None
    kb_ids: Sequence[str] | None = None
    filters: Filters | None = None
    top_k: int = 5
    engine: Retriever | None = None
    on_result: ResultCallback | None = None
    client: StrataClient | None = None
    async_client: AsyncStrataClient | None = None

    def run(self, query: str) -> RetrievalResult:
        """The registered retriever's result for ``query``; ``on_result`` sees it first (even when empty)."""
        if self.client is not None:
            return self._seen(self.client.retrieve_documents(query, self.top_k, **self._options()))
        if self.async_client is not None:
            raise InvalidArgumentError("this retriever has an async_client only: await it, or give it a client too")
        config = {"engine": self.engine} if self.engine is not None else {}
        scope = {
            name: value for name, value in (("kb_ids", self.kb_ids), ("filters", self.filters)) if value is not None
        }
        return self._seen(get_retriever(self.retriever_name(), **config).retrieve(query, self.top_k, **scope))

    async def arun(self, query: str) -> RetrievalResult:
        """``run``, awaited: on the service through ``async_client`` when given, else in strata's query pool."""
        if self.async_client is None:
            return await run_in_pool(partial(self.run, query))
        return self._seen(await self.async_client.retrieve_documents(query, self.top_k, **self._options()))

    def retriever_name(self) -> str:
        """The registered retriever this call runs: the given strategy, or the configured one."""
        if self.strategy is not None:
            return self.strategy
        settings = self.engine.settings if self.engine is not None else get_settings()  # default_engine()'s
        return settings.retrieval.strategy

    def _options(self) -> dict[str, Any]:
        """A service call's options: those this call sets (the service's defaults for the rest)."""
        options = {"kb_ids": self.kb_ids, "filters": self.filters, "strategy": self.strategy}
        return {name: value for name, value in options.items() if value is not None}

    def _seen(self, result: RetrievalResult) -> RetrievalResult:
        if self.on_result is not None:
            self.on_result(result)
        return result


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
