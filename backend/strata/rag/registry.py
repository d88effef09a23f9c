"""Retrievers by name: strata's strategies and a user's own, registered the same way.

A retriever is anything honouring ``RetrieverProtocol``; a factory builds one
from keyword configuration. strata registers its strategies (the names of
``strata.strategy_table``) through the same ``register_retriever`` call a
user makes::

    register_retriever("wiki", lambda **config: WikiRetriever(**config))
    wiki = get_retriever("wiki", lang="en")
    ours = get_retriever("auto_merge", kb_ids=["demo"])
    fused = retrieve_fused([ours, wiki], "password reset", top_k=5)   # N-list RRF

Results of different retrievers are fused by ``reciprocal_rank_fusion``
(``strata.rag.rank_fusion``), the same fusion strata uses inside.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol, runtime_checkable

from strata.config import ConfigError, Settings
from strata.errors import InvalidArgumentError
from strata.rag.rank_fusion import fuse_documents
from strata.strategy_table import STRATEGY_NAMES
from strata.types import Filters, RetrievalResult, RetrievedDocument


@runtime_checkable
class RetrieverProtocol(Protocol):
    """A named retriever: ``retrieve`` answers with evidence and a meta record.

    ``name`` is the name it is registered under; ``strategy`` says how it
    searches (strata's strategy name, or the user's own word).
    """

    @property
    def name(self) -> str: ...

    @property
    def strategy(self) -> str: ...

    def retrieve(self, query: str, top_k: int = 5, **kw: Any) -> RetrievalResult: ...


RetrieverFactory = Callable[..., RetrieverProtocol]

_factories: dict[str, RetrieverFactory] = {}
_lock = threading.Lock()


def register_retriever(name: str, factory: RetrieverFactory, *, replace: bool = False) -> None:
    """Makes ``get_retriever(name, **config)`` call ``factory(**config)``.

    A name is registered once; ``replace=True`` swaps the factory on purpose.
    """
    if not name or not name.strip():
        raise InvalidArgumentError("a retriever needs a non-empty name")
    with _lock:
        if name in _factories and not replace:
            raise InvalidArgumentError(f"retriever {name!r} is already registered (pass replace=True to swap it)")
        _factories[name] = factory


def available_retrievers() -> tuple[str, ...]:
    """The registered names, sorted."""
    with _lock:
        return tuple(sorted(_factories))


def get_retriever(name: str, **config: Any) -> RetrieverProtocol:
    """A new retriever built by the factory registered under ``name``."""
    with _lock:
        factory = _factories.get(name)
    if factory is None:
        raise ConfigError(f"unknown retriever {name!r}; registered: {', '.join(available_retrievers())}")
    retriever = factory(**config)
    if not isinstance(retriever, RetrieverProtocol):  # the factory's bug, not the caller's input: a TypeError
        raise TypeError(f"the factory of {name!r} built {type(retriever).__name__}, not a RetrieverProtocol")
    return retriever


@dataclass(frozen=True)
class FusedResult:
    """Documents fused from several retrievers, and each retriever's own result (in call order)."""

    docs: tuple[RetrievedDocument, ...]
    results: tuple[RetrievalResult, ...]


def retrieve_fused(
    retrievers: Sequence[RetrieverProtocol],
    query: str,
    top_k: int = 5,
    *,
    k: float = 60,
    weights: Sequence[float] | None = None,
) -> FusedResult:
    """Each retriever's ``top_k`` for ``query``, fused by RRF into the best ``top_k``.

    Every fused document carries ``metadata["fusion"]`` (its RRF score and its
    rank in each retriever's list); each retriever's meta record stays in
    ``results``.
    """
    results = tuple(r.retrieve(query, top_k) for r in retrievers)
    docs = fuse_documents([r.docs for r in results], k=k, weights=weights, limit=top_k)
    return FusedResult(docs=tuple(docs), results=results)


@dataclass(frozen=True)
class StrategyRetriever:
    """One of strata's strategies over ``retrieve_documents``.

    ``engine`` (a ``strata.rag.retrieve.Retriever`` built on the caller's own
    ``Resources``) replaces ``default_engine(settings)``, the process's engine of ``settings``.
    ``kb_ids`` and ``filters`` given to ``retrieve`` override the configured ones.
    """

    strategy: str
    kb_ids: tuple[str, ...] | None = None
    filters: Filters | None = None
    settings: Settings | None = None
    engine: Any = None

    def __post_init__(self) -> None:
        if self.kb_ids is not None:
            object.__setattr__(self, "kb_ids", tuple(self.kb_ids))

    @property
    def name(self) -> str:
        return self.strategy

    def retrieve(self, query: str, top_k: int = 5, **kw: Any) -> RetrievalResult:
        """The evidence for ``query`` by this strategy; outages show in the meta record."""
        call = self._call()
        kb_ids = kw.pop("kb_ids", self.kb_ids)
        args: dict[str, Any] = {
            "kb_ids": list(kb_ids) if kb_ids is not None else None,
            "filters": kw.pop("filters", self.filters),
            **kw,
        }
        return call(query, top_k, strategy=self.strategy, **args)

    def _call(self) -> Callable[..., RetrievalResult]:
        if self.engine is not None:
            return self.engine.retrieve
        from strata.rag.retrieve import retrieve_documents  # late: retrieve may one day resolve names here

        return partial(retrieve_documents, settings=self.settings)


for _strategy in STRATEGY_NAMES:
    register_retriever(_strategy, partial(StrategyRetriever, _strategy), replace=True)  # replace: reload-safe
