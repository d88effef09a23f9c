"""``retrieve_documents``: the orchestration of one query (no algorithms here).

encode → hybrid search (dense + BM25, RRF) → auto-merge L3→L2→L1 → rerank or
fused order → top_k → min-score cut, with every degraded path recorded in
the meta record and none raised to the caller. Each stage hands its frozen
outcome to the query's ``RunState`` (``strata.rag.outcomes``; the merge and
rerank stages are in ``strata.rag.stages``), whose ``result`` alone builds the
record. Arguments outside what strata accepts raise ``InvalidArgumentError``;
an unknown kb raises ``NotFoundError`` only from a retriever built with
``refuse_unknown_kbs`` (the service's), else the record says ``unknown_kb``.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol, assert_never

from cachetools import LRUCache

from strata.config import Settings, get_settings
from strata.errors import InvalidArgumentError, NotFoundError, StoreError
from strata.rag import stages
from strata.rag.bm25_hygiene import BM25QueryHygiene
from strata.rag.budget import check_budget, fit_to_budget
from strata.rag.candidates import Candidate
from strata.rag.deadline import Deadline
from strata.rag.expansion import load_synonyms
from strata.rag.finalize import finalize
from strata.rag.fingerprint import config_fingerprint, settings_fingerprint
from strata.rag.outcomes import CacheOutcome, FinalizeOutcome, FusionOutcome, RerankStageOutcome, SearchOutcome
from strata.rag.query_cache import Lookup, QueryCache, cache_key, normalize_query
from strata.rag.rank_fusion import fuse_candidates
from strata.rag.rerank import Reranker, build_reranker
from strata.rag.run_state import UNKNOWN_KB, RunInputs, RunState
from strata.rag.search import RouteSearch
from strata.rag.serving import LastServingStates
from strata.rag.strategy_plan import StrategyPlan, plan_for, query_variants
from strata.request import RetrievalRequest, cache_fields, takes_request_options
from strata.resources import Resources
from strata.stores import filters as expr
from strata.strategy_table import Merge
from strata.types import Chunk, RetrievalResult, RetrievedDocument, ServingState

logger = logging.getLogger(__name__)

PROBED_KBS = 4  # silent kbs a query asks Milvus about (``_note_missing_leaves``)


class ServingStates(Protocol):
    """What a query reads of its kbs in SQL (``DocumentStore.kbs``): their generations, and their serving
    state when a generation moved."""

    def generations(self, kb_ids: Sequence[str] | None, *, timeout_s: float | None = None) -> dict[str, str]: ...

    def serving_state(self, kb_ids: Sequence[str] | None, *, timeout_s: float | None = None) -> ServingState: ...


class Retriever:
    """Answers queries against the stores of one ``Resources``."""

    def __init__(
        self,
        resources: Resources,
        *,
        query_cache: QueryCache | None = None,
        refuse_unknown_kbs: bool = False,
        warm_up_first: bool = True,
    ) -> None:
        """``refuse_unknown_kbs``: a query naming a kb SQL does not know raises ``NotFoundError`` (once its run
        is recorded), as the service answers it (404); by default the meta record says so (``unknown_kb``).
        ``warm_up_first``: the first ``retrieve`` runs ``warm_up`` before its deadline starts; without it the
        first query pays its own cold start inside its deadline (a caller that warms up itself, or a test of
        one query against a store or encoder that hangs)."""
        self._res = resources
        self._refuse_unknown_kbs = refuse_unknown_kbs
        self._cfg = resources.settings.retrieval
        self._reranker = build_reranker(resources.settings.rerank)
        self._cache = query_cache or QueryCache(
            size=self._cfg.cache_size,
            ttl_s=self._cfg.cache_ttl_s,
            redis_settings=resources.settings.redis,
            breaker=resources.redis_breaker,
            decodes=_decodes,
        )
        self._states = LastServingStates()
        self._config_key = config_fingerprint(resources.settings)
        self._synonyms = load_synonyms(self._cfg.synonyms)
        self._routes = RouteSearch(resources, self._cfg)
        self._bm25_hygiene = BM25QueryHygiene(resources, self._cfg)
        self._warm = not warm_up_first
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

    @takes_request_options
    def retrieve(
        self, query: str, top_k: int = 5, *, cache_scope: str | None = None, **options: Any
    ) -> RetrievalResult:
        """The best ``top_k`` pieces of evidence and the meta record; never raises on outages.

        ``options`` are the other fields of ``strata.request.RetrievalRequest`` (this call's signature lists
        them): ``rerank=False`` keeps the fused order for this call even when a reranker is configured;
        ``expand=False`` searches BM25 with the query as given (no synonyms); ``strategy`` is one of
        ``strata.rag.STRATEGIES`` (default: the setting); ``queries`` are the ``fusion`` strategy's
        extra query variants; ``deadline_ms`` shortens this call's time budget (never past
        ``STRATA_RETRIEVAL__DEADLINE_MS``); ``max_chars`` returns at most that many characters of evidence instead
        of ``top_k`` whole documents when they hold more (``strata.rag.budget``: whole documents in rank order, the
        first that does not fit cut to the part that answered). ``cache_scope`` keeps this call's query-cache
        entries (and its single flight) to callers of the same scope: the service passes the API key's.
        """
        return self.retrieve_request(RetrievalRequest(query, top_k, **options), cache_scope=cache_scope)

    def retrieve_request(self, request: RetrievalRequest, *, cache_scope: str | None = None) -> RetrievalResult:
        """``retrieve`` of a request record (the service's routes hand theirs over as parsed)."""
        query, top_k = request.query, request.top_k
        self._cfg.check_query(query, top_k, request.queries or ())
        if request.max_chars is not None:
            check_budget(request.max_chars)  # before any work
        budget_ms = _budget_ms(self._cfg.deadline_ms, request.deadline_ms)
        self.warm_up()
        strategy = request.strategy or self._cfg.strategy
        plan = plan_for(strategy, routes=self._cfg.routes, merge_enabled=self._cfg.merge_enabled)
        if request.queries and not plan.multi_query:
            raise InvalidArgumentError(f"queries (query variants) apply to the fusion strategy, not {plan.name!r}")
        variants = (
            query_variants(query, given=request.queries, synonyms=self._synonyms, limit=self._cfg.fusion_max_variants)
            if plan.multi_query
            else ()
        )
        inputs = RunInputs(
            query,
            top_k,
            self._cfg.candidates_for(top_k),
            tuple(request.kb_ids) if request.kb_ids is not None else None,
            request.filters,
            strategy=plan.name,
            variants=variants,
            expansion=self._synonyms.expand(query) if request.expand else None,
        )
        run = RunState(inputs, deadline=Deadline(budget_ms / 1000))
        use_reranker = self._reranker if request.rerank is not False else None
        state, unknown = self._serving_state(run)
        if unknown is not None and self._refuse_unknown_kbs:
            run.finish()  # recorded (its spans, its log line) before it is refused
            raise unknown
        if state is None or not self._cache.enabled:
            self._compute(run, state, use_reranker, plan)
            run.add(CacheOutcome("query_cache", source="off"))
            return _within(run.finish(), request.max_chars)

        def compute() -> tuple[dict[str, Any], bool]:
            self._compute(run, state, use_reranker, plan)
            computed = run.result()
            return computed.to_dict(), computed.meta.status == "ok"

        key = query_cache_key(request, run.inputs, state, scope=cache_scope, config=self._config_key)
        lookup = self._cache.get_or_compute(key, compute, wait_s=run.deadline.remaining())
        run.add(_cache_outcome(run, lookup))
        return _within(run.finish(), request.max_chars)

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
        """Fills up to half of the in-process chunk cache with chunks, leaves first, so the first
        queries read their texts from memory as later ones do (Milvus Lite holds the whole collection
        in memory anyway). A shared Redis cache fills as queries read it."""
        cached = self._res.cached_chunks
        room = self._res.settings.redis.local_cache_size // 2
        if cached.in_process and room:
            loaded = self._res.documents.chunks.active_chunks(limit=room)
            cached.put_many(loaded)
            logger.info("warm-up: %d chunk texts in the in-process cache", len(loaded))

    def close(self) -> None:
        """Releases the reranker's HTTP client, the query cache's Redis client and the encoder worker."""
        if self._reranker is not None:
            self._reranker.close()
        self._cache.close()
        self._routes.close()

    # -- stages ------------------------------------------------------------------

    def _serving_state(self, run: RunState) -> tuple[ServingState | None, NotFoundError | None]:
        """SQL's serving state, during an outage the last one this process saw (none seen: fail closed); and
        the kbs requested that SQL does not know, as the error that refuses them (recorded in the run:
        ``errors[kb]``, ``unknown_kb``), else None. This is where a requested kb is looked up."""
        with run.timed("state"):
            try:
                state = self._current_state(run)
            except Exception as exc:
                return self._last_state(run, exc), None
        unknown = [k for k in run.inputs.kb_ids or () if k not in state.generations]
        if not unknown:
            return state, None
        refused = NotFoundError(f"unknown knowledge base(s): {', '.join(unknown)}")
        run.error_message("kb", type(refused).__name__, str(refused), UNKNOWN_KB)
        return state, refused

    def _current_state(self, run: RunState) -> ServingState:
        """The kbs' generations (one small query); the full state only when a generation moved since
        this process last read it: every change to what may be served bumps the generation."""
        kbs: ServingStates = self._res.documents.kbs
        last = self._states.get(run.inputs.kb_ids)
        if last is None or kbs.generations(run.inputs.kb_ids, timeout_s=run.deadline.remaining()) != last.generations:
            last = kbs.serving_state(run.inputs.kb_ids, timeout_s=run.deadline.remaining())
        self._states.remember(run.inputs.kb_ids, last)  # also keeps a state in use from being evicted
        return last

    def _last_state(self, run: RunState, exc: Exception) -> ServingState | None:
        last = self._states.get(run.inputs.kb_ids)
        if last is None:
            run.error(
                "state",
                exc,
                degraded="serving_state_unavailable",
                note="no serving state seen yet: refusing to serve versions that may be pending or retired",
            )
            return None
        run.error("state", exc, degraded="serving_state_stale", note="serving the last state this process saw")
        return last

    def _compute(
        self, run: RunState, state: ServingState | None, reranker: Reranker | None, plan: StrategyPlan
    ) -> None:
        """Runs the stages after the serving state, each handing its outcome to ``run``; stops early (no
        search ran: the run fails) without a state, a known kb, or the leaf index."""
        kb_ids = run.inputs.kb_ids
        if state is None or (kb_ids is not None and not any(k in state.generations for k in kb_ids)):
            return
        if not self._leaf_index_opens(run):
            return
        where = self._where(run, state)
        bm25_text = run.add(self._bm25_hygiene.apply(run, state, run.inputs.bm25_text, plan.routes)).text
        if plan.multi_query:
            candidates = self._search_variants(run, where, bm25_text, plan.routes)
        else:
            encoded = run.add(self._routes.encode(run, [run.inputs.query], plan.routes))
            found = run.add(self._routes.search(run, encoded.vector(0), where, bm25_text, plan.routes))
            candidates = list(found.candidates)
        self._note_missing_leaves(run, state)
        candidates = self._merged(run, candidates, plan.merge)
        reranked = run.add(self._rerank(run, candidates, reranker))
        min_score = self._cfg.min_score if reranked.applied else self._cfg.min_fused_score
        final = finalize(reranked.candidates, top_k=run.inputs.top_k, min_score=min_score)
        docs = tuple(_document(c) for c in final.kept)
        run.add(FinalizeOutcome("finalize", docs=docs, dropped=final.dropped_by_min_score))

    def _merged(self, run: RunState, candidates: list[Candidate], merge: Merge) -> list[Candidate]:
        """The candidates as the plan's merge shapes them (none found: nothing to merge)."""
        if not candidates:
            return candidates
        match merge:
            case "parents":
                return list(
                    run.add(stages.merge_parents(run, candidates, self._res.cached_chunks, self._cfg)).candidates
                )
            case "adjacent":
                return list(run.add(stages.merge_adjacent(run, candidates)).candidates)
            case "none":
                return candidates
            case _:  # a merge added to strategy_table.Merge and not here fails mypy, not a query
                assert_never(merge)

    def _note_missing_leaves(self, run: RunState, state: ServingState) -> None:
        """A dense search always finds the nearest leaves: a kb whose active versions SQL says have leaves but
        that gave no hit lacks them in the configured collection (``STRATA_MILVUS__URI`` or ``__COLLECTION``
        changed without ``strata rebuild``, or the leaves were lost). Said in the record as ``leaves_missing``,
        not answered as an ``ok`` with no (or only another kb's) evidence. Where a filter or another kb's nearer
        leaves may explain no hit, Milvus is asked whether it holds any leaf of the kb: for kbs the query named,
        at most ``PROBED_KBS`` of them (a query over every kb a key reads would otherwise ask once per kb)."""
        dense = [
            o for o in run.outcomes if isinstance(o, SearchOutcome) and o.mode in ("hybrid", "dense", "dense_fallback")
        ]
        kbs = [
            k
            for k in (run.inputs.kb_ids if run.inputs.kb_ids is not None else state.served_leaves)
            if state.served_leaves.get(k)
        ]
        if not dense or not kbs:
            return
        found = {c.chunk.kb_id for o in dense for c in o.candidates}
        silent = [k for k in kbs if k not in found]
        if silent and (run.inputs.filters_dict or found):
            if run.inputs.kb_ids is None or len(silent) > PROBED_KBS:
                return
            silent = [k for k in silent if not self._holds_leaves(k)]
        if not silent:
            return
        expected = sum(state.served_leaves[k] for k in silent)
        run.error_message(
            "search",
            "LeavesMissing",
            f"the Milvus collection {self._res.settings.milvus.collection!r} returned no leaf of knowledge base(s) "
            f"{', '.join(sorted(silent))}, which serve {expected} leaves in SQL: the leaves are in another Milvus or "
            f"collection, or lost; `strata reconcile --kb KB --repair` writes them from SQL",
            "leaves_missing",
        )

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
                self._res.open_leaf_index()
            except Exception as exc:
                run.error("search", exc, degraded="leaf_index_unavailable")
                return False
        return True

    def _search_variants(self, run: RunState, where: str, bm25_text: str, routes: str) -> list[Candidate]:
        """``fusion``: every query variant searched (one encoder call for all), fused by N-list RRF.
        A variant whose search failed is no list at all (not an empty one): the fused scores keep
        their scale, and the run's status says a variant failed."""
        encoded = run.add(self._routes.encode(run, run.inputs.variants, routes))
        lists: list[list[Candidate] | None] = []
        for i, variant in enumerate(run.inputs.variants):
            text = bm25_text if i == 0 else variant  # the query's (expanded, pruned) BM25 text; a variant as given
            found = run.add(self._routes.search(run, encoded.vector(i), where, text, routes, variant=variant))
            lists.append(list(found.candidates) if found.mode != "failed" else None)
        fused = fuse_candidates(lists, k=self._cfg.rrf_k, limit=run.inputs.candidate_k)
        run.add(FusionOutcome("fusion", candidates=tuple(fused), fused=len(fused)))
        return fused

    def _where(self, run: RunState, state: ServingState) -> str:
        hidden = state.hidden_version_keys
        return expr.all_of(
            expr.filters_expression(run.inputs.filters), expr.not_in("version_key", list(hidden)) if hidden else None
        )

    def _rerank(self, run: RunState, candidates: list[Candidate], reranker: Reranker | None) -> RerankStageOutcome:
        if reranker is None or not candidates:
            reason = "no candidates" if reranker else ("off for this request" if self._reranker else "not configured")
            return stages.rerank_skipped(run, candidates, reason)
        return stages.rerank(run, candidates, reranker)


def _cache_outcome(run: RunState, lookup: Lookup) -> CacheOutcome:
    """The query cache's lookup as an outcome: where the result came from, a Redis error, and the result another
    call computed (a hit or a shared one; ``from_dict`` of the stored record)."""
    log = run.log("query_cache")
    if lookup.cache_error:
        log.error_message("query_cache", "CacheError", lookup.cache_error, "query_cache_unavailable")
    reused = RetrievalResult.from_dict(lookup.value) if lookup.source != "miss" else None
    return log.outcome(CacheOutcome, source=lookup.source, reused=reused)


def query_cache_key(
    request: RetrievalRequest, inputs: RunInputs, state: ServingState, *, scope: str | None, config: Mapping[str, Any]
) -> str:
    """The query-cache key of ``request``: every field of the request (``strata.request.cache_fields``: all but those
    ``CACHE_KEY_LEAVES_OUT`` names, the query normalised, the kbs sorted), what the engine decided from it and
    the settings (the strategy that runs, its variants, the synonyms added), the kbs' generations, the caller's
    cache scope and the settings fingerprint."""
    asked = cache_fields(request)
    asked["query"] = normalize_query(request.query)
    asked["kb_ids"] = sorted(request.kb_ids) if request.kb_ids else None
    return cache_key(
        {
            "scope": scope,
            "request": asked,
            "gen": sorted(state.generations.items()),
            "config": config,
            "strategy": inputs.strategy,
            "variants": list(inputs.variants),
            "expanded": list(inputs.expansion.added_terms if inputs.expansion else ()),
        }
    )


def _within(result: RetrievalResult, max_chars: int | None) -> RetrievalResult:
    """``result`` cut to ``max_chars`` of evidence (``strata.rag.budget``); its meta counts what is returned."""
    if max_chars is None:
        return result
    docs = tuple(fit_to_budget(result.docs, max_chars))
    return replace(result, docs=docs, meta=replace(result.meta, returned=len(docs)))


def evidence_metadata(chunk: Chunk) -> dict[str, Any]:
    """The metadata a chunk carries as evidence: its own, then where it stands (ids, level, headings, offsets)."""
    return {
        **dict(chunk.metadata),
        "chunk_id": chunk.chunk_id,
        "doc_id": chunk.doc_id,
        "kb_id": chunk.kb_id,
        "version": chunk.version,
        "level": chunk.level,
        "heading_path": chunk.heading_path,
        "source": chunk.metadata.get("source", ""),
        "char_start": chunk.char_start,
        "char_end": chunk.char_end,
    }


def _document(cand: Candidate) -> RetrievedDocument:
    chunk = cand.chunk
    hit_start, hit_end = cand.hits()
    metadata = {
        **evidence_metadata(chunk),
        "merged_from": list(cand.merged_from),
        "hit_start": hit_start,
        "hit_end": hit_end,
        "trace": cand.trace.to_dict(),
    }
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


@takes_request_options
def retrieve_documents(
    query: str, top_k: int = 5, *, settings: Settings | None = None, **options: Any
) -> RetrievalResult:
    """The evidence for ``query`` from ``kb_ids`` (all kbs when None), plus the meta record.

    Outages never raise: they show in ``result.meta`` (``status`` degraded or
    failed, ``errors``, ``degraded`` reason codes). Bad arguments (an empty or
    over-long query, ``top_k`` outside 1..``max_top_k``, ``deadline_ms`` below 1)
    raise ``strata.errors.InvalidArgumentError`` (a ``ValueError``). ``options`` are the fields of
    ``strata.request.RetrievalRequest`` (this call's signature lists them; ``Retriever.retrieve`` says what
    each does); an unknown one raises ``TypeError``.
    """
    return default_engine(settings).retrieve(query, top_k, **options)


def _budget_ms(configured_ms: int, requested_ms: int | None) -> int:
    """A call's time budget: the caller's deadline when it is shorter than the configured one."""
    if requested_ms is None:
        return configured_ms
    if isinstance(requested_ms, bool) or not isinstance(requested_ms, int) or requested_ms < 1:
        raise InvalidArgumentError(f"deadline_ms must be a positive integer (milliseconds), got {requested_ms!r}")
    return min(configured_ms, requested_ms)
