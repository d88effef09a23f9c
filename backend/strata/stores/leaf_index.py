"""The leaf index: every kb's L3 leaves in Milvus, kept apart at one of Milvus's multi-tenancy levels.

``STRATA_MILVUS__ISOLATION`` names the level new leaves are written at
(docs/deploy.md has what each level shares and its limits):

- ``collection``: a collection per kb, named ``{collection}_kb_{hash of the kb id}``
  and carrying the kb id as its ``strata.kb`` property. A kb's BM25 statistics,
  segments, compaction and load state are its own; a query over several kbs
  searches each kb's collection and merges the hits by score.
- ``partition``: a partition per kb of the one collection ``{collection}``.
- ``partition_key``: ``kb_id`` is the partition key of the one collection; kbs
  share its buckets, so one kb's BM25 scores depend on the others' words.

The level of existing leaves is read from Milvus, never guessed: the shared
collection's schema when it exists, else the kb collections under its name; a
setting naming another level is refused (``strata rebuild --to-uri URI
--isolation LEVEL`` moves the leaves). ``LeafIndex`` has one interface for
every level; ``LeafCollection`` (``strata.stores.milvus_collection``) is one collection.

Opening the index creates no collection. A collection is created where leaves
are about to be written: ``open_kb`` (the indexer's, with the run's front-matter
terms) or a write, so its BM25 dictionary (fixed by Milvus at creation) is the
same whichever reader (a warm-up, a query, a delete) opened the index first.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
import numpy as np
from pymilvus.exceptions import MilvusException

from strata.config import MilvusSettings
from strata.errors import EncoderMismatchError, StoreError, StoreTimeoutError, UnsupportedAnalyzer
from strata.stores.analyzer import lite_analyzer_problem
from strata.stores.milvus_collection import LeafCollection
from strata.stores.milvus_connection import connect
from strata.stores.milvus_search import LeafSearch
from strata.stores.milvus_setup import DIM_PROPERTY, ENCODER_PROPERTY, KB_PROPERTY, layout_of
from strata.stores.store_timeouts import is_grpc_deadline, milvus_bound, timed_out
from strata.types import Chunk, RouteHit

LEVELS = ("collection", "partition", "partition_key")
T = TypeVar("T")
_SEARCHES = ThreadPoolExecutor(max_workers=8, thread_name_prefix="strata-kb-search")  # a multi-kb query's searches

# One route's search of one collection: (its searches, the kbs to search, the timeout) -> each query's hits.
RouteSearch = Callable[[LeafSearch, Sequence[str] | None, float | None], list[list[RouteHit]]]


def kb_collection_name(base: str, kb_id: str) -> str:
    """The collection of ``kb_id`` at the ``collection`` level: a valid Milvus name for any kb id."""
    return f"{base}_kb_{hashlib.sha1(kb_id.encode()).hexdigest()[:20]}"


def default_level(settings: MilvusSettings, *, tenants: bool) -> str:
    """``auto``'s level for leaves written now: ``collection`` on a Milvus server or for a service with API keys
    (``tenants``), whose kbs belong to teams that must not learn about each other; ``partition`` on an embedded
    Milvus Lite file, one user's."""
    if settings.isolation != "auto":
        return settings.isolation
    return "collection" if tenants or not settings.is_lite else "partition"


class LeafIndex:
    """Upserts, deletes and searches the leaves of every kb, at the isolation level Milvus holds them at."""

    def __init__(
        self,
        settings: MilvusSettings,
        *,
        encoder_name: str,
        dim: int,
        vocabulary: Callable[[Sequence[str] | None], Iterable[str]] = lambda kb_ids: (),
        tenants: bool = False,
    ) -> None:
        """``vocabulary(kb_ids)`` gives the known terms the jieba analyzer of a collection created later keeps
        whole (the front-matter modules and skill points of those kbs; None: of every kb); ``open_kb`` adds
        the terms of the documents about to be written. ``tenants``: the service has API keys
        (``default_level``)."""
        self._settings = settings
        self._base = settings.collection
        # a kb's collection is looked up on the query path too: cut as a search is
        self._lookup_timeout = min(settings.search_timeout_s, settings.timeout_s)
        self._encoder: dict[str, Any] = {"encoder_name": encoder_name, "dim": dim}
        self._vocabulary = vocabulary
        self._connection = connect(settings)
        self._client, self._on_lite = self._connection
        self._lock = threading.RLock()
        self._kbs: dict[str, LeafCollection] = {}
        self._owners: dict[str, str] = {}  # kb collection name -> its kb (its ``strata.kb`` property)
        self._written: set[str] = set()
        try:
            if self._on_lite and (problem := lite_analyzer_problem(settings.analyzer)):
                raise UnsupportedAnalyzer(f"STRATA_MILVUS__ANALYZER: {problem}")  # at start, not at a kb's first write
            self.isolation = self._read_level(default_level(settings, tenants=tenants))
            self._shared_level = self.isolation != "collection"
            self._shared: LeafCollection | None = None  # the shared levels' collection, once it exists
            if self._shared_level:
                self._shared_collection()  # an existing one is checked now (encoder, analyzer), as a kb's is
        except BaseException:
            self._client.close()
            raise

    # -- the level ------------------------------------------------------------

    def _read_level(self, default: str) -> str:
        """The level existing leaves were written at (refusing a setting that names another), else ``default``."""
        names = self._meta("list_collections")
        kb_collections = [n for n in names if n.startswith(f"{self._base}_kb_")]
        found = None
        if self._base in names:
            found = layout_of(self._meta("describe_collection", self._base))
            if found == "single":
                raise StoreError(
                    f"Milvus collection {self._base!r} is one knowledge base's; STRATA_MILVUS__COLLECTION names the shared one"
                )
            if kb_collections:
                raise StoreError(
                    f"Milvus holds both a shared collection {self._base!r} and {len(kb_collections)} knowledge base "
                    f"collection(s) under its name ({kb_collections[0]}...): drop the ones that are not in use, or "
                    "point STRATA_MILVUS__COLLECTION elsewhere"
                )
        elif kb_collections:
            found = "collection"
            self._check_encoder(sorted(kb_collections)[0])
        wanted = self._settings.isolation
        if found is not None and wanted != "auto" and wanted != found:
            raise StoreError(
                f"the leaves under Milvus collection name {self._base!r} are kept apart at the {found} level, but "
                f"STRATA_MILVUS__ISOLATION is {wanted}: set it to auto (the level Milvus holds) or {found}, or move "
                f"them (strata rebuild --kb KB --to-uri URI --isolation {wanted})"
            )
        return found or default

    def _check_encoder(self, name: str) -> None:
        """Refuses another encoder than the kb collections' at once, as a shared collection's opening does."""
        props = self._meta("describe_collection", name).get("properties") or {}
        built = (props.get(ENCODER_PROPERTY, "<unknown encoder>"), int(props.get(DIM_PROPERTY) or 0))
        if built != (self._encoder["encoder_name"], self._encoder["dim"]):
            raise EncoderMismatchError(
                f"the Milvus collections under {self._base!r} were built with encoder {built[0]} (dim {built[1]}); the "
                f"configured encoder is {self._encoder['encoder_name']} (dim {self._encoder['dim']}). Use another "
                "collection name (STRATA_MILVUS__COLLECTION) or rebuild the knowledge bases with this encoder."
            )

    @property
    def on_lite(self) -> bool:
        return self._on_lite

    @property
    def analyzer_tokenizer(self) -> str:
        """The tokenizer name of the configured BM25 analyzer (``jieba``, ``standard``...)."""
        tokenizer = self._settings.analyzer.get("tokenizer")
        return tokenizer.get("type", "") if isinstance(tokenizer, dict) else str(tokenizer or "")

    def open_kb(self, kb_id: str, extra_terms: Iterable[str] = ()) -> None:
        """Opens the collection the kb's leaves are written to, creating it when it does not exist. A collection
        created here gets in its BM25 dictionary the known front-matter terms (the kb's at the ``collection``
        level, every kb's at the shared levels) and ``extra_terms``, those of the documents about to be written;
        an existing collection keeps the dictionary it was created with."""
        self._collection(kb_id, create=True, extra_terms=tuple(extra_terms))

    def dictionary_for(self, kb_id: str) -> frozenset[str]:
        """The terms the analyzer of the kb's collection keeps whole (none while it has no collection)."""
        found = self._collection(kb_id)
        return found.dictionary if found is not None else frozenset()

    # -- writes ---------------------------------------------------------------

    def upsert(self, leaves: Sequence[Chunk], vectors: np.ndarray, search_texts: Sequence[str]) -> None:
        if not leaves:
            return
        kb_ids = {leaf.kb_id for leaf in leaves}
        if len(kb_ids) != 1:  # the pipeline writes a kb at a time: a bug of strata's caller, not input
            raise ValueError("upsert takes leaves of one knowledge base at a time")
        kb_id = kb_ids.pop()
        collection = self._collection(kb_id, create=True)
        assert collection is not None
        with self._lock:
            self._written.add(kb_id)
        collection.writes.upsert(leaves, vectors, search_texts)

    def delete_version(self, kb_id: str, doc_id: str, version: int) -> None:
        self._on_kb(kb_id, lambda c: c.writes.delete_version(kb_id, doc_id, version), None)

    def delete_document(self, kb_id: str, doc_id: str) -> None:
        self._on_kb(kb_id, lambda c: c.writes.delete_document(kb_id, doc_id), None)

    def delete_leaves(self, kb_id: str, chunk_ids: Sequence[str]) -> None:
        self._on_kb(kb_id, lambda c: c.writes.delete_leaves(kb_id, chunk_ids), None)

    def delete_kb(self, kb_id: str) -> None:
        """Every leaf of the kb; at the ``collection`` level its collection goes with them."""
        if self._shared_level:
            self._on_kb(kb_id, lambda c: c.writes.delete_kb(kb_id), None)
            return
        name = kb_collection_name(self._base, kb_id)
        with self._lock:
            self._kbs.pop(kb_id, None)
            self._written.discard(kb_id)
            if name in self._meta("list_collections"):
                self._meta("drop_collection", name)

    def drop_empty_kb(self, kb_id: str) -> None:
        """At the ``collection`` level, the kb's collection once it holds no leaf (a dropped kb's, after its
        versions were removed one by one); at the shared levels there is nothing of the kb's own to drop."""
        if self._shared_level or self.count(kb_id) > 0:
            return
        self.delete_kb(kb_id)

    def flush(self) -> None:
        """Seals written rows (of every collection written since the last flush)."""
        if self._shared_level:
            if (shared := self._shared_collection()) is not None:
                shared.writes.flush()
            return
        with self._lock:
            written, self._written = sorted(self._written), set()
        for kb_id in written:
            self._on_kb(kb_id, lambda c: c.writes.flush(), None)

    def drop_collection(self) -> None:
        """Drops every collection under the configured name (benchmarks and tests that made their own)."""
        if self._shared_level:
            with self._lock:
                if (shared := self._shared_collection()) is not None:
                    shared.writes.drop_collection()
                self._shared = None  # a later write creates it again
            return
        with self._lock:
            self._kbs.clear()
            for name in self._meta("list_collections"):
                if name.startswith(f"{self._base}_kb_"):
                    self._meta("drop_collection", name)

    # -- reads ----------------------------------------------------------------

    def count(self, kb_id: str, *, doc_id: str | None = None, version: int | None = None) -> int:
        return self._on_kb(kb_id, lambda c: c.reads.count(kb_id, doc_id=doc_id, version=version), 0)

    def count_versions(self, kb_id: str, versions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Leaves of each ``(doc_id, version)`` of a kb, in as few reads as the collection allows."""
        return self._on_kb(kb_id, lambda c: c.reads.count_versions(kb_id, versions), dict.fromkeys(versions, 0))

    def leaf_ids(self, kb_id: str) -> dict[str, tuple[str, int]]:
        return self._on_kb(kb_id, lambda c: c.reads.leaf_ids(kb_id), {})

    def present(self, kb_id: str, chunk_ids: Sequence[str]) -> set[str]:
        return self._on_kb(kb_id, lambda c: c.reads.present(kb_id, chunk_ids), set())

    def dense_vectors(self, kb_id: str, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return self._on_kb(kb_id, lambda c: c.reads.dense_vectors(kb_id, chunk_ids), {})

    def holds_any(self, kb_id: str) -> bool:
        return self._on_kb(kb_id, lambda c: c.reads.holds_any(kb_id), False)

    def ping(self) -> dict[str, Any]:
        """One metadata call to the server, cut at the search timeout (readiness: no count, no data read)."""
        if self._shared is not None:
            return {**self._shared.reads.ping(), "isolation": self.isolation}
        self._meta("list_collections", timeout=self._settings.search_timeout_s)
        name = self._base if self._shared_level else f"{self._base}_kb_*"
        return {"collection": name, "isolation": self.isolation}

    def search_dense_many(
        self,
        vectors: Sequence[np.ndarray],
        *,
        limit: int,
        kb_ids: Sequence[str] | None,
        where: str = "",
        timeout: float | None = None,
        with_source: bool = False,
    ) -> list[list[RouteHit]]:
        """Top leaves by inner product for each vector (``LeafSearch.search_dense_many``), over the kbs'
        collections: their hits merged by score."""

        def search(searches: LeafSearch, kbs: Sequence[str] | None, cut: float | None) -> list[list[RouteHit]]:
            return searches.search_dense_many(
                vectors, limit=limit, kb_ids=kbs, where=where, timeout=cut, with_source=with_source
            )

        return self._route(len(vectors), limit, kb_ids, timeout, search)

    def search_sparse(
        self,
        text: str,
        *,
        limit: int,
        kb_ids: Sequence[str] | None,
        where: str = "",
        timeout: float | None = None,
        with_source: bool = False,
    ) -> list[RouteHit]:
        return self.search_sparse_many(
            [text], limit=limit, kb_ids=kb_ids, where=where, timeout=timeout, with_source=with_source
        )[0]

    def search_sparse_many(
        self,
        texts: Sequence[str],
        *,
        limit: int,
        kb_ids: Sequence[str] | None,
        where: str = "",
        timeout: float | None = None,
        with_source: bool = False,
    ) -> list[list[RouteHit]]:
        """Top leaves by BM25 for each text (``LeafSearch.search_sparse_many``). At the ``collection`` level
        each kb's hits are scored by its own statistics, then merged by score."""

        def search(searches: LeafSearch, kbs: Sequence[str] | None, cut: float | None) -> list[list[RouteHit]]:
            return searches.search_sparse_many(
                texts, limit=limit, kb_ids=kbs, where=where, timeout=cut, with_source=with_source
            )

        return self._route(len(texts), limit, kb_ids, timeout, search)

    def _route(
        self, queries: int, limit: int, kb_ids: Sequence[str] | None, timeout: float | None, search: RouteSearch
    ) -> list[list[RouteHit]]:
        """One route's search of ``queries`` queries: the shared collection's, or each kb collection's merged
        (``_merged``); no hits while the collection does not exist."""
        if self._shared_level:
            shared = self._shared_collection()
            if shared is None:
                return [[] for _ in range(queries)]
            return search(shared.searches, kb_ids, timeout)
        return self._merged(queries, limit, kb_ids, lambda kb_id, c: search(c.searches, [kb_id], timeout))

    def fetch_leaves(self, refs: Sequence[tuple[str, str]], *, timeout: float | None = None) -> dict[str, Chunk]:
        if self._shared_level:
            shared = self._shared_collection()
            return shared.searches.fetch_leaves(refs, timeout=timeout) if shared is not None else {}
        by_kb: dict[str, list[tuple[str, str]]] = {}
        for kb_id, chunk_id in refs:
            by_kb.setdefault(kb_id, []).append((kb_id, chunk_id))
        found: dict[str, Chunk] = {}
        no_leaves: dict[str, Chunk] = {}
        for kb_id, kb_refs in by_kb.items():
            found.update(self._on_kb(kb_id, functools.partial(_fetch_leaves, refs=kb_refs, timeout=timeout), no_leaves))
        return found

    def close(self) -> None:
        self._client.close()

    # -- helpers --------------------------------------------------------------

    def _merged(
        self,
        queries: int,
        limit: int,
        kb_ids: Sequence[str] | None,
        search: Callable[[str, LeafCollection], list[list[RouteHit]]],
    ) -> list[list[RouteHit]]:
        """Each query's hits over the kbs' collections (``search(kb_id, collection)``), best first, ``limit`` of
        them. The kbs' searches run at once (each a call to Milvus that waits on the network)."""
        merged: list[list[RouteHit]] = [[] for _ in range(queries)]
        kbs = self._kb_ids(kb_ids)
        if len(kbs) == 1:
            found_each = [self._on_kb(kbs[0], functools.partial(search, kbs[0]), None)]
        else:
            futures = [_SEARCHES.submit(self._on_kb, kb_id, functools.partial(search, kb_id), None) for kb_id in kbs]
            found_each = [future.result() for future in futures]
        for found in found_each:
            for i, hits in enumerate(found or ()):
                merged[i].extend(hits)
        return [sorted(hits, key=lambda h: h.score, reverse=True)[:limit] for hits in merged]

    def _kb_ids(self, kb_ids: Sequence[str] | None) -> list[str]:
        """The kbs asked for; None: every kb that has a collection (read from the collections' properties)."""
        if kb_ids is not None:
            return list(dict.fromkeys(kb_ids))
        found = []
        for name in self._meta("list_collections", timeout=self._lookup_timeout):
            if name.startswith(f"{self._base}_kb_"):
                if name not in self._owners:  # a collection's kb never changes: described once
                    props = (
                        self._meta("describe_collection", name, timeout=self._lookup_timeout).get("properties") or {}
                    )
                    self._owners[name] = props.get(KB_PROPERTY) or ""
                if self._owners[name]:
                    found.append(self._owners[name])
        return found

    def _on_kb(self, kb_id: str, call: Callable[[LeafCollection], T], empty: T) -> T:
        """``call`` on the kb's collection; ``empty`` when the kb has none (never written, or dropped by another
        process since this one opened it)."""
        collection = self._collection(kb_id)
        if collection is None:
            return empty
        if self._shared_level:  # the one collection: its errors are the call's
            return call(collection)
        try:
            return call(collection)
        except StoreTimeoutError:
            raise  # a server that did not answer in time: asking it more would wait again
        except StoreError as failed:
            try:
                gone = not self._meta(
                    "has_collection", kb_collection_name(self._base, kb_id), timeout=self._lookup_timeout
                )
            except StoreError:
                raise failed from None  # Milvus is down: the call's own error says so
            if not gone:
                raise
            with self._lock:
                self._kbs.pop(kb_id, None)
            return empty

    def _collection(
        self, kb_id: str, *, create: bool = False, extra_terms: Sequence[str] = ()
    ) -> LeafCollection | None:
        """The collection holding the kb's leaves at this level; None when it does not exist and ``create`` is
        False. One created here gets the known terms and ``extra_terms`` in its BM25 dictionary (``open_kb``)."""
        if self._shared_level:
            return self._shared_collection(create=create, extra_terms=extra_terms)
        return self._kb_collection(kb_id, create=create, extra_terms=extra_terms)

    def _shared_collection(self, *, create: bool = False, extra_terms: Sequence[str] = ()) -> LeafCollection | None:
        """The shared levels' one collection, opened once it exists (looked up again until then: another
        process may create it)."""
        if self._shared is not None:
            return self._shared
        with self._lock:
            if self._shared is None:
                if not create and not self._meta("has_collection", self._base, timeout=self._lookup_timeout):
                    return None
                self._shared = LeafCollection(
                    self._settings,
                    **self._encoder,
                    layout=self.isolation,
                    client=self._connection,
                    vocabulary=lambda: [*self._vocabulary(None), *extra_terms],
                )
            return self._shared

    def _kb_collection(
        self, kb_id: str, *, create: bool = False, extra_terms: Sequence[str] = ()
    ) -> LeafCollection | None:
        with self._lock:
            if kb_id in self._kbs:
                return self._kbs[kb_id]
            name = kb_collection_name(self._base, kb_id)
            if not self._meta("has_collection", name, timeout=self._lookup_timeout):
                if not create:
                    return None
                held = sum(1 for n in self._meta("list_collections") if n.startswith(f"{self._base}_kb_"))
                if held >= self._settings.max_collections:
                    raise StoreError(
                        f"knowledge base {kb_id!r} would be collection {held + 1:,} under {self._base!r}, over "
                        f"STRATA_MILVUS__MAX_COLLECTIONS ({self._settings.max_collections:,}; Milvus refuses more "
                        "than rootCoord.maxCollectionNum, 65,536 per cluster by default). Raise it within Milvus's "
                        "limits, or move kbs to the partition level (strata rebuild --to-uri URI --isolation partition)"
                    )
            collection = LeafCollection(
                self._settings,
                **self._encoder,
                name=name,
                kb_id=kb_id,
                client=self._connection,
                vocabulary=lambda: [*self._vocabulary([kb_id]), *extra_terms],
            )
            self._kbs[kb_id] = collection
            return collection

    def _meta(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        limit = timeout or self._settings.timeout_s
        try:
            return getattr(self._client, method)(*args, timeout=limit)
        except (MilvusException, grpc.RpcError) as exc:
            if is_grpc_deadline(exc):
                bound = milvus_bound(limit, self._settings)
                raise timed_out("Milvus", method, bound, address=str(self._settings.uri)) from exc
            raise StoreError(f"Milvus {method} failed: {exc}") from exc


def _fetch_leaves(
    collection: LeafCollection, *, refs: list[tuple[str, str]], timeout: float | None
) -> dict[str, Chunk]:
    return collection.searches.fetch_leaves(refs, timeout=timeout)
