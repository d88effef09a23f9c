"""The search stage: query vectors, the dense and BM25 routes, RRF fusion and the fallbacks.

Hybrid search, or the fallbacks the settings allow: dense-only when hybrid
fails, BM25-only when there is no query vector (or dense failed too). A
switched-off fallback is a ``failed`` answer with the reason, never a quieter
route. ``encode`` and ``search`` return frozen outcomes (``EncodeOutcome``,
``SearchOutcome``: what they produced, the mode the search ran in, errors and
timings); they read the run's inputs and write none of its state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from strata.config import RetrievalSettings
from strata.errors import DeadlineExceeded
from strata.rag.candidates import Candidate
from strata.rag.microbatch import MicroBatcher
from strata.rag.outcomes import EncodeOutcome, SearchOutcome
from strata.rag.rank_fusion import Fused
from strata.rag.route_fusion import FusionWeights, as_candidate, rrf_rank, single_rank
from strata.rag.run_state import RunState, StageLog
from strata.resources import Resources
from strata.stores import filters as expr
from strata.types import Chunk, Mode, RouteHit

Ranked = Fused[RouteHit]


# Share of the deadline the encoder leaves for the searches after it (BM25 alone, if it timed out).
ENCODE_KEEPS = 0.4
# Searches again without the leaves SQL does not serve, when they filled the candidate list (``_served``).
UNSERVED_RETRIES = 2


@dataclass(frozen=True)
class _RouteKey:
    """What searches must share to run as one Milvus search."""

    route: str
    kb_ids: tuple[str, ...] | None
    where: str
    limit: int
    exact_prefix: str  # a source prefix checked after the search ("" for none)


class _Routed(NamedTuple):
    """The ranked hits of the routes that answered, the mode that is, and each route's hit count."""

    ranked: list[Ranked]
    mode: Mode
    dense: int = 0
    sparse: int = 0


_NO_ROUTE = _Routed([], "failed")


class RouteSearch:
    """Runs one query's routes against the leaf index of one ``Resources``."""

    def __init__(self, resources: Resources, settings: RetrievalSettings) -> None:
        self._res = resources
        self._cfg = settings
        # The encoder and the searches run in workers, so a hung one costs a query its share of the
        # deadline, not forever; queries that arrive together share an encoder call and a search.
        window_s, most = settings.batch_window_ms / 1000, settings.batch_max
        self._encodings: MicroBatcher[str, np.ndarray] = MicroBatcher(
            lambda _, texts: list(resources.encoder.encode_queries(texts)),
            window_s=window_s,
            max_batch=most,
            name="strata-encode",
        )
        self._searches: MicroBatcher[tuple[Any, float], list[RouteHit]] = MicroBatcher(
            self._search_batch, window_s=window_s, max_batch=most, name="strata-search", inline_when_idle=True
        )  # a Milvus search is bounded by its own timeout: one caller runs it in its own thread

    def encode(self, run: RunState, queries: Sequence[str], routes: str) -> EncodeOutcome:
        """Query vectors (one encoder call for every query, shared with concurrent queries); none for BM25-only or when the encoder failed."""
        log = run.log("encode")
        if routes == "sparse":
            return log.outcome(EncodeOutcome)
        wait = run.deadline.within(float("inf"), keep_s=ENCODE_KEEPS * run.deadline.budget_s)
        with log.timed("encode"):
            try:
                if wait <= 0:
                    raise DeadlineExceeded("encode")
                vectors = tuple(self._encodings.submit(None, queries).result(timeout=wait))
            except FutureTimeout:
                log.error("encode", DeadlineExceeded("encode"), degraded="query_encoder_failed")
                vectors = None
            except Exception as exc:
                log.error("encode", exc, degraded="query_encoder_failed")
                vectors = None
        return log.outcome(EncodeOutcome, vectors=vectors)

    def close(self) -> None:
        self._encodings.close()
        self._searches.close()

    def search(
        self, run: RunState, vector: np.ndarray | None, where: str, bm25_text: str, routes: str, *, variant: str = ""
    ) -> SearchOutcome:
        """Hybrid search, or the fallbacks the settings allow: dense-only when hybrid fails,
        BM25-only when there is no query vector (or dense failed too). BM25 searches ``bm25_text``
        (the query plus its synonyms); the dense route embedded the query as given. The routes
        return ids; the fused candidates' leaves are read in one batch afterwards. The outcome's
        mode is the route(s) that answered; ``failed`` when none did or the leaves are unreadable."""
        log = run.log("search")
        with log.timed("search"):
            routed, candidates = self._served(run, log, vector, where, bm25_text, routes)
        mode = "failed" if candidates is None else routed.mode
        return log.outcome(
            SearchOutcome,
            variant=variant or run.inputs.query,
            mode=mode,
            candidates=tuple(candidates or ()),
            dense=routed.dense,
            sparse=routed.sparse,
            fused=len(routed.ranked),
        )

    def weights(self) -> FusionWeights:
        if self._cfg.fusion == "weighted_rrf":
            return FusionWeights(self._cfg.vector_weight, self._cfg.keyword_weight)
        return FusionWeights()

    def _ranked(
        self, run: RunState, log: StageLog, vector: np.ndarray | None, where: str, bm25_text: str, routes: str
    ) -> _Routed:
        if routes != "hybrid":
            return self._single(run, log, routes, vector, where, bm25_text)
        if vector is not None:
            fused = self._hybrid(run, log, vector, where, bm25_text)
            if fused is not None:
                return fused
            if self._cfg.dense_fallback:
                dense = self._route(run, log, "dense", vector, where)
                if dense is not None:
                    return _Routed(self._one_route(run, dense, "dense"), "dense_fallback", dense=len(dense))
        if not self._cfg.sparse_fallback:
            reason = "fallbacks switched off" if vector is not None else "query encoder failed and BM25 fallback is off"
            log.error_message("search", "NoRouteLeft", reason)
            return _NO_ROUTE
        sparse = self._route(run, log, "sparse", bm25_text, where)
        if sparse is None:
            return _NO_ROUTE
        return _Routed(self._one_route(run, sparse, "sparse"), "sparse_fallback", sparse=len(sparse))

    def _single(
        self, run: RunState, log: StageLog, route: str, vector: np.ndarray | None, where: str, bm25_text: str
    ) -> _Routed:
        """A deliberately single-route configuration (``routes = dense | sparse``): no fallback."""
        query = vector if route == "dense" else bm25_text
        hits = self._route(run, log, route, query, where, stage="search") if query is not None else None
        if hits is None:
            return _NO_ROUTE
        return _Routed(self._one_route(run, hits, route), route, **{route: len(hits)})  # type: ignore[arg-type]

    def _one_route(self, run: RunState, hits: list[RouteHit], route: str) -> list[Ranked]:
        return single_rank(hits, route=route, k=self._cfg.rrf_k, limit=run.inputs.candidate_k, weights=self.weights())

    def _hybrid(self, run: RunState, log: StageLog, vector: np.ndarray, where: str, bm25_text: str) -> _Routed | None:
        try:
            dense = self._submit("dense", run, vector, where)
            sparse = self._submit("sparse", run, bm25_text, where)
            dense_hits, sparse_hits = self._wait("dense", run, dense), self._wait("sparse", run, sparse)
        except Exception as exc:
            log.error("search", exc, degraded="hybrid_search_failed")
            return None
        fused = rrf_rank(
            dense_hits, sparse_hits, k=self._cfg.rrf_k, limit=run.inputs.candidate_k, weights=self.weights()
        )
        return _Routed(fused, "hybrid", dense=len(dense_hits), sparse=len(sparse_hits))

    def _route(
        self, run: RunState, log: StageLog, route: str, query: Any, where: str, *, stage: str = ""
    ) -> list[RouteHit] | None:
        try:
            return self._wait(route, run, self._submit(route, run, query, where))
        except Exception as exc:
            log.error(stage or f"{route}_fallback", exc)
            return None

    def _submit(self, route: str, run: RunState, query: Any, where: str) -> Future:
        """The route's search, queued to share a Milvus search with concurrent queries like it."""
        if run.deadline.expired():
            raise DeadlineExceeded(f"the {route} route (a Milvus search)")
        key = _RouteKey(
            route,
            tuple(run.inputs.kb_ids) if run.inputs.kb_ids is not None else None,
            where,
            self._cfg.route_limit(run.inputs.candidate_k),
            _exact_prefix(run),
        )
        return self._searches.submit(key, [(query, run.deadline.remaining())])

    def _wait(self, route: str, run: RunState, search: Future) -> list[RouteHit]:
        remaining = run.deadline.remaining()
        try:
            hits: list[RouteHit] = search.result(timeout=None if math.isinf(remaining) else remaining)[0]
        except FutureTimeout:
            raise DeadlineExceeded(f"the {route} route (a Milvus search)") from None
        prefix = _exact_prefix(run)
        return [h for h in hits if h.source.startswith(prefix)] if prefix else hits

    def _search_batch(self, key: _RouteKey, items: list[tuple[Any, float]]) -> list[list[RouteHit]]:
        """One Milvus search for the queries of concurrent requests with the same key (the longest
        time any of them has left bounds it)."""
        index = self._res.leaf_index
        search = index.search_dense_many if key.route == "dense" else index.search_sparse_many
        return search(
            [query for query, _ in items],
            limit=key.limit,
            kb_ids=key.kb_ids,
            where=key.where,
            timeout=max(left for _, left in items),
            with_source=bool(key.exact_prefix),
        )

    def _served(
        self, run: RunState, log: StageLog, vector: np.ndarray | None, where: str, bm25_text: str, routes: str
    ) -> tuple[_Routed, list[Candidate] | None]:
        """The ranked hits and their candidates, none of them a leaf SQL does not serve. Such a leaf (an orphan
        a lost run wrote, a version removed since, a Milvus restored from an older backup) is reported
        (``unserved_leaves``) and must not take a served leaf's place: when the search's list was full, it is
        searched again without the leaves found unserved, at most ``UNSERVED_RETRIES`` times."""
        unserved: list[str] = []
        for _ in range(1 + UNSERVED_RETRIES):
            excluded = expr.all_of(where, expr.not_in("chunk_id", unserved)) if unserved else where
            routed = self._ranked(run, log, vector, excluded, bm25_text, routes)
            if not routed.ranked:
                return routed, []
            candidates, missing = self._with_leaves(run, log, routed.ranked)
            if candidates is None or not missing or len(routed.ranked) < run.inputs.candidate_k:
                break
            unserved.extend(missing)
        return routed, candidates

    def _with_leaves(
        self, run: RunState, log: StageLog, ranked: list[Ranked]
    ) -> tuple[list[Candidate] | None, list[str]]:
        """The fused hits as candidates: their leaves from the chunk cache (then SQL) in one
        batch, or from the index itself when that fails (None when that fails too); and the ids of
        the leaves SQL does not hold (a version removed after the search, an orphan), left out and reported."""
        refs = [(f.item.kb_id, f.key) for f in ranked]
        missing: list[str] = []
        with log.timed("leaf_fetch"):
            try:
                fetch = self._res.cached_chunks.get_many(refs, timeout_s=run.deadline.remaining())
                leaves: dict[str, Chunk] | None = dict(fetch.chunks)
                log.leaf_fetch(fetch)
                missing = list(fetch.missing)
            except Exception as exc:
                log.error("leaf_fetch", exc, note="leaf texts read from the leaf index")
                leaves = self._from_index(run, log, refs)
        if leaves is None:
            return None, missing
        return [as_candidate(f, leaves[f.key]) for f in ranked if f.key in leaves], missing

    def _from_index(self, run: RunState, log: StageLog, refs: list[tuple[str, str]]) -> dict[str, Chunk] | None:
        try:
            return self._res.leaf_index.fetch_leaves(refs, timeout=run.deadline.remaining())
        except Exception as exc:
            log.error("leaf_fetch", exc, degraded="leaf_fetch_failed")
            return None


def _exact_prefix(run: RunState) -> str:
    """The source prefix to check on each hit after the search ("" for none): LIKE wildcards in it over-match."""
    prefix = run.inputs.filters.source_prefix if run.inputs.filters else ""
    return prefix if prefix and expr.needs_exact_check(prefix) else ""
