"""``retrieve_documents``: the orchestration of one query (no algorithms here).

encode → hybrid search (dense + BM25, RRF) → auto-merge L3→L2→L1 → rerank or
fused order → top_k → min-score cut, with every degraded path recorded in
the meta record and none raised to the caller.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import replace
from typing import Any, Sequence

from cachetools import LRUCache

from strata.config import Settings, get_settings
from strata.errors import StoreError
from strata.rag.candidates import Candidate
from strata.rag.deadline import Deadline, DeadlineExceeded
from strata.rag.expansion import Expansion, load_synonyms
from strata.rag.finalize import finalize
from strata.rag.adjacent import merge_adjacent_chunks
from strata.rag.bm25_hygiene import BM25QueryHygiene
from strata.rag.rank_fusion import fuse_candidates
from strata.rag.merge import apply_merge, parents_to_fetch
from strata.rag.fingerprint import config_fingerprint, settings_fingerprint
from strata.rag.query_cache import QueryCache, cache_key, normalize_query
from strata.rag.run_state import UNKNOWN_KB, FusionOutcome, RunState, SearchOutcome
from strata.rag.rerank import Reranker, build_reranker
from strata.rag.search import RouteSearch
from strata.rag.serving import LastServingStates
from strata.rag.strategies import StrategyPlan, plan_for, query_variants
from strata.resources import Resources
from strata.stores import filters as expr
from strata.types import Filters, MergeRound, RerankOutcome, RetrievalResult, RetrievedDocument, ServingState

logger = logging.getLogger(__name__)

PROBED_KBS = 4  # silent kbs a query asks Milvus about (``_note_missing_leaves``)


class Retriever:
    """Answers queries against the stores of one ``Resources``."""

    def __init__(self, resources: Resources, *, query_cache: QueryCache | None = None) -> None:
        self._res = resources
        self._cfg = resources.settings.retrieval
        self._reranker = build_reranker(resources.settings.rerank)
        self._cache = query_cache or QueryCache(
            size=self._cfg.cache_size, ttl_s=self._cfg.cache_ttl_s, redis_settings=resources.settings.redis,
            breaker=resources.redis_breaker, decodes=_decodes,
        )  # fmt: skip
        self._states = LastServingStates()
        self._config_key = config_fingerprint(resources.settings)
        self._synonyms = load_synonyms(self._cfg.synonyms)
        self._routes = RouteSearch(resources, self._cfg)
        self._bm25_hygiene = BM25QueryHygiene(resources, self._cfg)
        self._warm = False
        self._warm_lock = threading.Lock()

    @property
    def settings(self) -> Settings:
        """The settings of the stores this retriever answers from."""
        return self._res.settings

    @property
    def resources(self) -> Resources:
        """The stores and models this retriever answers from (the caller's to close, unless from ``default_engine``)."""
        return self._res

    @property
    def reranker(self) -> Reranker | None:
        return self._reranker

    def retrieve(
        self, query: str, top_k: int = 5, *, kb_ids: Sequence[str] | None = None, filters: Filters | None = None,
        rerank: bool = True, expand: bool = True, strategy: str | None = None, queries: Sequence[str] | None = None,
        deadline_ms: int | None = None, cache_scope: str | None = None,
    ) -> RetrievalResult:  # fmt: skip
        """The best ``top_k`` pieces of evidence and the meta record; never raises on outages.

        ``rerank=False`` keeps the fused order for this call even when a reranker is configured;
        ``expand=False`` searches BM25 with the query as given (no synonyms); ``strategy`` is one
        of ``strata.rag.strategies.STRATEGIES`` (default: the setting); ``queries`` are the
        ``fusion`` strategy's extra query variants; ``deadline_ms`` shortens this call's time
        budget (never past ``STRATA_RETRIEVAL__DEADLINE_MS``). ``cache_scope`` keeps this call's query-cache
        entries (and its single flight) to callers of the same scope: the service passes the API key's.
        """
        self._cfg.check_query(query, top_k, queries or ())
        budget_ms = _budget_ms(self._cfg.deadline_ms, deadline_ms)
        if isinstance(kb_ids, str):
            raise ValueError("kb_ids must be a list of knowledge base ids, not a string")
        self.warm_up()
        plan = plan_for(strategy or self._cfg.strategy, routes=self._cfg.routes, merge_enabled=self._cfg.merge_enabled)
        if queries and not plan.multi_query:
            raise ValueError(f"queries (query variants) apply to the fusion strategy, not {plan.name!r}")
        candidate_k = self._cfg.candidates_for(top_k)
        run = RunState(
            query, top_k, candidate_k, tuple(kb_ids) if kb_ids is not None else None, filters,
            deadline=Deadline(budget_ms / 1000),
        )  # fmt: skip
        run.strategy = plan.name
        if plan.multi_query:
            run.variants = query_variants(query, given=queries, synonyms=self._synonyms, limit=self._cfg.fusion_max_variants)
        use_reranker = self._reranker if rerank else None
        expansion = self._synonyms.expand(query) if expand else Expansion(query, ())
        state = self._serving_state(run)
        if state is None or not self._cache.enabled:
            return run.traced(run.uncached(self._compute(run, state, use_reranker, expansion, plan)))
        computed: list[RetrievalResult] = []

        def compute() -> tuple[dict[str, Any], bool]:
            computed.append(self._compute(run, state, use_reranker, expansion, plan))
            return computed[0].to_dict(), computed[0].meta.status == "ok"

        lookup = self._cache.get_or_compute(self._cache_key(run, state, rerank, expansion, cache_scope), compute)
        if lookup.cache_error:
            run.error_message("query_cache", "CacheError", lookup.cache_error, "query_cache_unavailable")
        if lookup.source == "miss":
            return run.traced(run.with_cache_errors(computed[0]))
        return run.traced(run.from_cache(RetrievalResult.from_dict(lookup.value), lookup.source))

    def warm_up(self) -> None:
        """Loads what the first query would (the encoder's model, the BM25 analyzer's dictionary, chunk
        texts into the in-process cache) once, outside any request's deadline: a cold start is not an
        outage. Failures are left to the query."""
        with self._warm_lock:
            if self._warm:
                return
            self._warm = True
            started = time.perf_counter()
            try:
                self._res.encoder.encode_queries(["warm up"])
                self._res.leaf_index.search_sparse("warm up", limit=1, kb_ids=None)
                self._preload_chunks()
            except Exception as exc:
                logger.warning("warm-up did not complete: %s: %s", type(exc).__name__, exc)
            logger.info("retriever warmed up in %.0f ms", (time.perf_counter() - started) * 1000)

    def _preload_chunks(self) -> None:
        """Fills up to half of the in-process parent cache with chunks, leaves first, so the first
        queries read their texts from memory as later ones do (Milvus Lite holds the whole collection
        in memory anyway). A shared Redis cache fills as queries read it."""
        parents = self._res.parents
        room = self._res.settings.redis.local_cache_size // 2
        if parents.in_process and room:
            loaded = self._res.documents.active_chunks(limit=room)
            parents.put_many(loaded)
            logger.info("warm-up: %d chunk texts in the in-process cache", len(loaded))

    def _cache_key(self, run: RunState, state: ServingState, rerank: bool, expansion: Expansion, scope: str | None) -> str:
        return cache_key({
            "scope": scope,
            "q": normalize_query(run.query), "top_k": run.top_k, "kbs": sorted(run.kb_ids) if run.kb_ids else None,
            "filters": run.filters_dict, "gen": sorted(state.generations.items()), "rerank": rerank,
            "expanded": list(expansion.added_terms), "config": self._config_key, "strategy": run.strategy,
            "variants": list(run.variants),
        })  # fmt: skip

    def close(self) -> None:
        """Releases the reranker's HTTP client, the query cache's Redis client and the encoder worker."""
        if self._reranker is not None:
            self._reranker.close()
        self._cache.close()
        self._routes.close()

    # -- stages ------------------------------------------------------------------

    def _serving_state(self, run: RunState) -> ServingState | None:
        """SQL's serving state; during an outage the last one this process saw (fail closed)."""
        with run.timed("state"):
            try:
                state = self._current_state(run)
            except Exception as exc:
                return self._last_state(run, exc)
        unknown = [k for k in run.kb_ids or () if k not in state.generations]
        if unknown:
            run.error_message("kb", "NotFoundError", f"unknown knowledge base(s): {', '.join(unknown)}", UNKNOWN_KB)
        return state

    def _current_state(self, run: RunState) -> ServingState:
        """The kbs' generations (one small query); the full state only when a generation moved since
        this process last read it: every change to what may be served bumps the generation."""
        documents, last = self._res.documents, self._states.get(run.kb_ids)
        if last is None or documents.generations(run.kb_ids, timeout_s=run.deadline.remaining()) != last.generations:
            last = documents.serving_state(run.kb_ids, timeout_s=run.deadline.remaining())
        self._states.remember(run.kb_ids, last)  # also keeps a state in use from being evicted
        return last

    def _last_state(self, run: RunState, exc: Exception) -> ServingState | None:
        last = self._states.get(run.kb_ids)
        if last is None:
            run.error(
                "state", exc, degraded="serving_state_unavailable",
                note="no serving state seen yet: refusing to serve versions that may be pending or retired",
            )  # fmt: skip
            return None
        run.error("state", exc, degraded="serving_state_stale", note="serving the last state this process saw")
        return last

    def _compute(
        self, run: RunState, state: ServingState | None, reranker: Reranker | None, expansion: Expansion,
        plan: StrategyPlan,
    ) -> RetrievalResult:  # fmt: skip
        if state is None or (run.kb_ids is not None and not any(k in state.generations for k in run.kb_ids)):
            return _expanded(run.result([], dropped=0), expansion)  # no search ran: failed
        if not self._leaf_index_opens(run):
            return _expanded(run.result([], dropped=0), expansion)
        where = self._where(run, state)
        searched = self._bm25_hygiene.apply(run, state, expansion, plan.routes)  # the BM25 text, pruned
        if plan.multi_query:
            candidates = self._search_variants(run, where, searched, plan.routes)
        else:
            encoded = run.add(self._routes.encode(run, [run.query], plan.routes))
            found = run.add(self._routes.search(run, encoded.vector(0), where, searched.bm25_text, plan.routes))
            candidates = list(found.candidates)
        self._note_missing_leaves(run, state)
        if plan.merge == "parents" and candidates:
            candidates = self._merge(run, candidates)
        elif plan.merge == "adjacent" and candidates:
            with run.timed("merge"):
                candidates = merge_adjacent_chunks(candidates)
        candidates, reranked = self._rerank(run, candidates, reranker)
        final = finalize(candidates, top_k=run.top_k, min_score=self._cfg.min_score if reranked else self._cfg.min_fused_score)
        return _expanded(run.result([_document(c) for c in final.kept], dropped=final.dropped_by_min_score), expansion)

    def _note_missing_leaves(self, run: RunState, state: ServingState) -> None:
        """A dense search always finds the nearest leaves: a kb whose active versions SQL says have leaves but
        that gave no hit lacks them in the configured collection (``STRATA_MILVUS__URI`` or ``__COLLECTION``
        changed without ``strata rebuild``, or the leaves were lost). Said in the record as ``leaves_missing``,
        not answered as an ``ok`` with no (or only another kb's) evidence. Where a filter or another kb's nearer
        leaves may explain no hit, Milvus is asked whether it holds any leaf of the kb: for kbs the query named,
        at most ``PROBED_KBS`` of them (a query over every kb a key reads would otherwise ask once per kb)."""
        dense = [o for o in run.outcomes if isinstance(o, SearchOutcome) and o.mode in ("hybrid", "dense", "dense_fallback")]
        kbs = [k for k in (run.kb_ids if run.kb_ids is not None else state.served_leaves) if state.served_leaves.get(k)]
        if not dense or not kbs:
            return
        found = {c.chunk.kb_id for o in dense for c in o.candidates}
        silent = [k for k in kbs if k not in found]
        if silent and (run.filters_dict or found):
            if run.kb_ids is None or len(silent) > PROBED_KBS:
                return
            silent = [k for k in silent if not self._holds_leaves(k)]
        if not silent:
            return
        expected = sum(state.served_leaves[k] for k in silent)
        run.error_message(
            "search", "LeavesMissing",
            f"the Milvus collection {self._res.settings.milvus.collection!r} returned no leaf of knowledge base(s) "
            f"{', '.join(sorted(silent))}, which serve {expected} leaves in SQL: the leaves are in another Milvus or "
            f"collection, or lost; `strata reconcile --kb KB --repair` writes them from SQL",
            "leaves_missing",
        )  # fmt: skip

    def _holds_leaves(self, kb_id: str) -> bool:
        """Whether Milvus holds any leaf of ``kb_id``; True when it cannot tell (its failure is the search's)."""
        try:
            return self._res.leaf_index.holds_any(kb_id)
        except StoreError:
            return True

    def _leaf_index_opens(self, run: RunState) -> bool:
        """A Milvus Lite file another process holds (``IndexLockedError``, e.g. during ``strata index``) is
        the query's failure, named in the meta record: no route can search without it, and finding out
        costs no network. Otherwise the encoder would spend the deadline first (the machine busy indexing)
        and the record would blame it, the lock error lost in the warm-up's log or a search abandoned at
        the deadline. A server's connection errors surface in the search stage as before."""
        if not self._res.settings.milvus.is_lite:
            return True
        with run.timed("search"):
            try:
                self._res.leaf_index  # noqa: B018 - opens it once; afterwards a cached attribute
            except Exception as exc:
                run.error("search", exc, degraded="leaf_index_unavailable")
                return False
        return True

    def _search_variants(self, run: RunState, where: str, expansion: Expansion, routes: str) -> list[Candidate]:
        """``fusion``: every query variant searched (one encoder call for all), fused by N-list RRF.
        A variant whose search failed is no list at all (not an empty one): the fused scores keep
        their scale, and the run's status says a variant failed."""
        encoded = run.add(self._routes.encode(run, run.variants, routes))
        lists: list[list[Candidate] | None] = []
        for i, variant in enumerate(run.variants):
            bm25_text = expansion.bm25_text if i == 0 else variant
            found = run.add(self._routes.search(run, encoded.vector(i), where, bm25_text, routes, variant=variant))
            lists.append(list(found.candidates) if found.mode != "failed" else None)
        fused = fuse_candidates(lists, k=self._cfg.rrf_k, limit=run.candidate_k)
        run.add(FusionOutcome("fusion", candidates=tuple(fused), fused=len(fused)))
        return fused

    def _where(self, run: RunState, state: ServingState) -> str:
        hidden = state.hidden_version_keys
        return expr.all_of(
            expr.filters_expression(run.filters), expr.not_in("version_key", list(hidden)) if hidden else None
        )

    def _merge(self, run: RunState, candidates: list[Candidate]) -> list[Candidate]:
        if run.deadline.expired():  # the leaves as found are the answer
            run.error("merge", DeadlineExceeded("merge"))
            return candidates
        with run.timed("merge"):
            for round_no, level in ((1, 3), (2, 2)):
                candidates = self._merge_round(run, candidates, round_no, level)
        return candidates

    def _merge_round(self, run: RunState, candidates: list[Candidate], round_no: int, level: int) -> list[Candidate]:
        refs = parents_to_fetch(candidates, level=level, min_children=self._cfg.merge_min_children)
        if not refs:
            run.merge_rounds.append(MergeRound(round=round_no))
            return candidates
        with run.timed("parent_fetch"):
            try:
                fetch = self._res.parents.get_many(refs, timeout_s=run.deadline.remaining())
            except Exception as exc:
                run.error("parent_fetch", exc, degraded="parent_fetch_failed")
                run.merge_rounds.append(MergeRound(round=round_no, parents_missing=len(refs)))
                return candidates
        run.parent_fetch(fetch)
        merged, record = apply_merge(
            candidates, fetch.chunks, round_no=round_no, level=level, min_children=self._cfg.merge_min_children,
            min_ratio=self._cfg.merge_min_ratio, score_mode=self._cfg.merge_score,
        )  # fmt: skip
        run.merge_rounds.append(record)
        return merged

    def _rerank(self, run: RunState, candidates: list[Candidate], reranker: Reranker | None) -> tuple[list[Candidate], bool]:
        if reranker is None or not candidates:
            reason = "no candidates" if reranker else ("off for this request" if self._reranker else "not configured")
            run.rerank = RerankOutcome("skipped", reason)
            return candidates, False
        started = time.perf_counter()
        try:
            with run.timed("rerank"):
                if run.deadline.expired():
                    raise DeadlineExceeded("rerank")
                scores = reranker.rerank(run.query, [c.chunk.text for c in candidates], timeout_s=run.deadline.remaining())
        except Exception as exc:
            latency = (time.perf_counter() - started) * 1000
            run.rerank = RerankOutcome("failed", f"{type(exc).__name__}: {exc}", reranker.provider, round(latency, 2))
            run.error("rerank", exc, degraded="rerank_failed")
            return candidates, False
        latency = (time.perf_counter() - started) * 1000
        run.rerank = RerankOutcome("applied", "ok", reranker.provider, round(latency, 2))
        return [_reranked(candidates[s.index], s.score) for s in scores], True


def _expanded(result: RetrievalResult, expansion: Expansion) -> RetrievalResult:
    """The meta record with the terms query expansion added to the BM25 route (none: left empty)."""
    if not expansion.added_terms:
        return result
    record = {"added_terms": list(expansion.added_terms), "bm25_query": expansion.bm25_text}
    return replace(result, meta=replace(result.meta, expansion=record))


def _reranked(cand: Candidate, score: float) -> Candidate:
    return replace(cand, score=score, trace=replace(cand.trace, rerank_score=score, score_stage="rerank"))


def _document(cand: Candidate) -> RetrievedDocument:
    chunk = cand.chunk
    metadata = {
        **dict(chunk.metadata),
        "chunk_id": chunk.chunk_id, "doc_id": chunk.doc_id, "kb_id": chunk.kb_id, "version": chunk.version,
        "level": chunk.level, "heading_path": chunk.heading_path, "source": chunk.metadata.get("source", ""),
        "char_start": chunk.char_start, "char_end": chunk.char_end, "merged_from": list(cand.merged_from),
        "trace": cand.trace.to_dict(),
    }  # fmt: skip
    return RetrievedDocument(content=chunk.text, score=cand.score, metadata=metadata)


def _decodes(value: dict[str, Any]) -> bool:
    try:
        RetrievalResult.from_dict(value)
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return True


DEFAULT_ENGINES = 4
"""How many default engines (one per configuration) a process keeps; the least recently used goes first."""


class _Engines(LRUCache[str, Retriever]):
    """The default engines by settings fingerprint; an engine evicted (or ``clear``-ed) is closed."""

    def popitem(self) -> tuple[str, Retriever]:
        key, engine = super().popitem()
        _close_engine(engine)
        return key, engine


_engines = _Engines(maxsize=DEFAULT_ENGINES)
_engines_lock = threading.Lock()


def default_engine(settings: Settings | None = None) -> Retriever:
    """The process's ``Retriever`` of these settings (default: the environment's), built on first use
    over ``Resources`` of its own; ``retrieve_documents`` and the framework adapters use it.

    Keyed on a fingerprint that includes the secrets (hashed): settings that differ only by a
    token never share an engine. At most ``DEFAULT_ENGINES`` are kept: the least recently used
    one is closed when another configuration needs room (a caller still holding it then gets
    errors in its meta records), and all are closed when the interpreter exits. A caller that
    manages its own lifetimes builds ``Retriever(Resources(settings))`` and closes it.
    """
    settings = settings or get_settings()
    key = settings_fingerprint(settings)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = Retriever(Resources(settings))
        return engine


def _close_engine(engine: Retriever) -> None:
    """Closes a default engine: its own clients, then the stores it owns."""
    try:
        engine.close()
        engine.resources.close()
    except Exception as exc:  # closing is best effort: one engine's failure must not keep the others open
        logger.warning("closing a default engine failed: %s: %s", type(exc).__name__, exc)


@atexit.register
def close_default_engines() -> None:
    """Closes every default engine (registered with ``atexit``; tests call it to start afresh)."""
    with _engines_lock:
        while _engines:
            _engines.popitem()


def retrieve_documents(
    query: str,
    top_k: int = 5,
    *,
    kb_ids: list[str] | None = None,
    filters: Filters | None = None,
    rerank: bool = True,
    expand: bool = True,
    strategy: str | None = None,
    queries: Sequence[str] | None = None,
    deadline_ms: int | None = None,
    settings: Settings | None = None,
) -> RetrievalResult:
    """The evidence for ``query`` from ``kb_ids`` (all kbs when None), plus the meta record.

    Outages never raise: they show in ``result.meta`` (``status`` degraded or
    failed, ``errors``, ``degraded`` reason codes). Bad arguments (an empty or
    over-long query, ``top_k`` outside 1..``max_top_k``, ``deadline_ms`` below 1)
    raise ``ValueError``. ``deadline_ms`` shortens this call's time budget.
    """
    return default_engine(settings).retrieve(
        query, top_k, kb_ids=kb_ids, filters=filters, rerank=rerank, expand=expand, strategy=strategy, queries=queries,
        deadline_ms=deadline_ms,
    )


def _budget_ms(configured_ms: int, requested_ms: int | None) -> int:
    """A call's time budget: the caller's deadline when it is shorter than the configured one."""
    if requested_ms is None:
        return configured_ms
    if isinstance(requested_ms, bool) or not isinstance(requested_ms, int) or requested_ms < 1:
        raise ValueError(f"deadline_ms must be a positive integer (milliseconds), got {requested_ms!r}")
    return min(configured_ms, requested_ms)
