"""One Milvus collection of L3 leaves (Milvus Lite file or a Milvus server): ``LeafCollection``.

A collection belongs to one encoder identity: the encoder name and dimension
are recorded as collection properties and a mismatch is refused. Each leaf has
a dense vector (HNSW/IP) and a BM25 sparse vector computed by Milvus from the
analyzed ``text`` field. A collection keeps its kbs apart by its layout, read
from its schema and properties:

- ``partition``: a partition per kb. Lite scans every row of the searched
  partitions in Python, and measured on CMRC 2018 leaves a partition-limited
  hybrid search took 14 ms where a ``kb_id`` filter over a 3-kb collection took
  41 ms and no filter 62 ms.
- ``partition_key``: ``kb_id`` is the partition key; a ``kb_id in [...]`` filter prunes.
- ``single``: the collection holds one kb (its ``strata.kb`` property), the
  ``collection`` isolation level of ``strata.stores.leaf_index``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import numpy as np
from pymilvus import DataType, Function, FunctionType, MilvusClient
from pymilvus.exceptions import MilvusException

from strata.config import MilvusSettings
from strata.errors import ConfigError, EncoderMismatchError, IndexLockedError, StoreError
from strata.stores import filters as expr
from strata.stores.analyzer import UnsupportedAnalyzer, lite_analyzer_problem
from strata.stores.keys import partition_name, version_key
from strata.stores.leaf_rows import leaf_row
from strata.stores.leaf_schema import analyzer_identity, analyzer_of, analyzer_with_dictionary, dictionary_of
from strata.stores.lite_engine import LiteEngine
from strata.stores.milvus_search import LeafSearch
from strata.stores.store_timeouts import Bound, is_grpc_deadline, milvus_bound, timed_out
from strata.types import Chunk

logger = logging.getLogger(__name__)

ENCODER_PROPERTY = "strata.encoder"
DIM_PROPERTY = "strata.dim"
KB_PROPERTY = "strata.kb"  # the one kb of a collection of the ``collection`` isolation level
_UPSERT_BATCH = 500
_COLLECTION_NOT_LOADED = 101  # Milvus's error code (merr) for a collection that is not loaded
_CONNECT_FAILED = 2  # pymilvus's code for a channel not ready within the client's timeout
QUERY_WINDOW = 16_384  # most rows a Milvus server returns for one query (offset + limit)


class LeafCollection:
    """Upserts, deletes and searches L3 leaves of one collection (its searches: ``searches``, a ``LeafSearch``)."""

    def __init__(
        self,
        settings: MilvusSettings,
        *,
        encoder_name: str,
        dim: int,
        vocabulary: Callable[[], Iterable[str]] = lambda: (),
        layout: str | None = None,
        name: str | None = None,
        kb_id: str | None = None,
        client: tuple[MilvusClient, bool] | None = None,
    ) -> None:
        """``vocabulary`` (called only when the collection is created) gives the terms the jieba
        analyzer must keep whole: the modules and skill points of the documents' front-matter.
        ``layout`` (``partition`` or ``partition_key``) is how a collection created now keeps its kbs apart
        (None: ``settings.isolation``'s); with ``kb_id`` the collection ``name`` holds that kb alone
        (``single``). ``client`` is a connection to share (``connect``'s); it stays open at ``close``."""
        self._settings = settings
        self._name = name or settings.collection
        self._kb = kb_id
        self._timeout = settings.timeout_s
        self._search_timeout = settings.search_timeout_s
        self._count_timeout = settings.count_timeout_s
        self._flush_timeout = settings.flush_timeout_s
        self._encoder_name = encoder_name
        self._dim = dim
        wanted = layout or settings.isolation
        # for a new collection; an existing one says its own layout (``_adopt_layout``)
        self._use_partitions = kb_id is None and (wanted == "partition" or (wanted == "auto" and settings.is_lite))
        self._vocabulary = vocabulary
        self.dictionary: frozenset[str] = frozenset()  # the terms the collection's analyzer keeps whole
        self._owns_client = client is None
        self._client, self._on_lite = connect(settings) if client is None else client
        engine = LiteEngine(str(settings.uri), self._name) if settings.is_lite and settings.lite_in_process else None
        self.searches = LeafSearch(
            self._name,
            search_ef=settings.search_ef,
            engine=engine,
            call=self._call,
            partitions_for=self._partitions_for,
            where=self._where,
            cut=self._cut,
        )
        self._partitions: set[str] = set()
        self._partitions_lock = threading.Lock()
        self._ensure_collection()
        if engine is not None and not engine.available():
            logger.warning(
                "Milvus Lite's engine for %s is not in this process's milvus-lite (another version?): "
                "the route searches go through its gRPC server",
                settings.uri,
            )

    # -- collection lifecycle -------------------------------------------------

    def _ensure_collection(self) -> None:
        try:
            if not self._client.has_collection(self._name, timeout=self._timeout):
                try:
                    self._create_collection()
                except MilvusException:
                    if not self._client.has_collection(self._name, timeout=self._timeout):
                        raise  # else another process (a second worker) created it meanwhile: open theirs
            if not self._client.list_indexes(self._name, timeout=self._timeout):  # its creator stopped before them
                self._client.create_index(self._name, self._index_params(), timeout=self._timeout, sync=False)
            described = self._client.describe_collection(self._name, timeout=self._timeout)
            self._check_identity(described)
            self._check_analyzer(described)
            self._adopt_layout(described)
            self.dictionary = dictionary_of(described)
            self._load()
            if self._use_partitions:
                self._partitions = set(self._client.list_partitions(self._name, timeout=self._timeout))
        except MilvusException as exc:
            raise StoreError(f"Milvus collection {self._name!r} could not be opened: {exc}") from exc

    def _load(self) -> None:
        """Loads the collection; on a Milvus Lite file, again after removing each index file it could not read.

        Milvus Lite builds a segment's index after a flush and writes it in place (``faiss.write_index``), so a
        process killed meanwhile leaves a truncated ``.idx`` file that every later open failed on ("read error
        in ...dense.hnsw.idx"). An index file is derived from its segment's rows: removed, Lite builds it again
        from them. Only a file the error names, in this collection's own ``indexes`` folders, is removed, and
        each at most once.
        """
        removed: set[str] = set()
        while True:
            try:
                self._client.load_collection(
                    self._name, replica_number=self._settings.replica_number, timeout=self._timeout
                )
                return
            except MilvusException as exc:
                named = (
                    lite_index_named(str(exc), str(self._settings.uri), self._name) if self._settings.is_lite else None
                )
                if named is None or named in removed:
                    raise
                removed.add(named)
            with contextlib.suppress(FileNotFoundError):
                os.remove(named)
            logger.warning(
                "Milvus Lite could not read the index file %s (a process stopped while writing it?): "
                "removed it, Milvus Lite builds it again from the segment's rows",
                named,
            )

    @property
    def analyzer_tokenizer(self) -> str:
        return analyzer_tokenizer(self._settings)

    def _check_identity(self, described: dict[str, Any]) -> None:
        props = described.get("properties") or {}
        dense_dim = next(
            (int(f["params"]["dim"]) for f in described.get("fields", []) if f.get("name") == "dense"), None
        )
        built_name = props.get(ENCODER_PROPERTY, "<unknown encoder>")
        built_dim = int(props.get(DIM_PROPERTY) or dense_dim or 0)
        if built_name != self._encoder_name or built_dim != self._dim or dense_dim != self._dim:
            raise EncoderMismatchError(
                f"Milvus collection {self._name!r} was built with encoder {built_name} (dim {built_dim}); "
                f"the configured encoder is {self._encoder_name} (dim {self._dim}). Use another collection "
                f"(STRATA_MILVUS__COLLECTION) or rebuild the knowledge bases with this encoder."
            )

    def _check_analyzer(self, described: dict[str, Any]) -> None:
        """Refuses a configured analyzer other than the one the collection's BM25 index was built with: Milvus
        keeps the collection's, while strata's term statistics and query pruning would follow the setting."""
        built = analyzer_of(described)
        if built is None or analyzer_identity(built) == analyzer_identity(self._settings.analyzer):
            return
        raise ConfigError(
            f"STRATA_MILVUS__ANALYZER is {json.dumps(self._settings.analyzer, ensure_ascii=False)}, but Milvus "
            f"collection {self._name!r} was built with {json.dumps(analyzer_identity(built), ensure_ascii=False)}: "
            "its BM25 index keeps that analyzer. Set STRATA_MILVUS__ANALYZER back to it, or copy the knowledge bases "
            "into a new collection built with the new one (strata rebuild --kb KB --collection NAME)"
        )

    def _adopt_layout(self, described: dict[str, Any]) -> None:
        """Keeps kbs apart the way the collection was built (``layout_of``), whatever a setting says for new
        collections: the same collection reached through a Lite file and through a server (or after
        ``strata rebuild``) is used the one way it was created (``LeafIndex`` refuses a setting naming another)."""
        layout = layout_of(described)
        if (self._kb is not None) != (layout == "single"):
            raise StoreError(
                f"Milvus collection {self._name!r} keeps knowledge bases apart by {layout}, not as the collection of "
                f"knowledge base {self._kb!r}"
                if self._kb is not None
                else f"Milvus collection {self._name!r} is the collection of one knowledge base, not a shared one"
            )
        if self._kb is not None and (owner := (described.get("properties") or {}).get(KB_PROPERTY)) != self._kb:
            raise StoreError(f"Milvus collection {self._name!r} holds knowledge base {owner!r}, not {self._kb!r}")
        self._use_partitions = layout == "partition"
        self.layout = layout

    @property
    def on_lite(self) -> bool:
        """Milvus Lite: a ``.db`` file, or a ``milvus-lite server`` (learnt when connecting)."""
        return self._on_lite

    def _create_collection(self) -> None:
        if self.on_lite and (problem := lite_analyzer_problem(self._settings.analyzer)):
            raise UnsupportedAnalyzer(f"STRATA_MILVUS__ANALYZER: {problem}")
        logger.info("creating Milvus collection %s (%s, dim %d)", self._name, self._encoder_name, self._dim)
        self._client.create_collection(
            self._name,
            schema=self._schema(),
            properties={
                ENCODER_PROPERTY: self._encoder_name,
                DIM_PROPERTY: str(self._dim),
                **({KB_PROPERTY: self._kb} if self._kb else {}),
            },
            timeout=self._timeout,
        )
        # sync=False: the collection is empty, and pymilvus's wait for the build sleeps 0.5 s per index (a new
        # kb's collection in 15 ms instead of 1 s); loading it (``_ensure_collection``) needs the index only declared
        self._client.create_index(self._name, self._index_params(), timeout=self._timeout, sync=False)

    def _schema(self) -> Any:
        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        add = schema.add_field
        add("chunk_id", DataType.VARCHAR, is_primary=True, max_length=64)
        add("kb_id", DataType.VARCHAR, max_length=256, is_partition_key=not self._use_partitions and self._kb is None)
        add("doc_id", DataType.VARCHAR, max_length=2048)
        add("version", DataType.INT64)
        add("version_key", DataType.VARCHAR, max_length=32)
        add("parent_id", DataType.VARCHAR, max_length=64)
        add("root_id", DataType.VARCHAR, max_length=64)
        add("level", DataType.INT64)
        add("ordinal", DataType.INT64)
        add("heading_path", DataType.VARCHAR, max_length=4096)
        add("module", DataType.VARCHAR, max_length=512)
        add("skill_points", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=256, max_length=512)
        add("source", DataType.VARCHAR, max_length=2048)
        add("char_start", DataType.INT64)
        add("char_end", DataType.INT64)
        add("metadata", DataType.JSON)
        add("content", DataType.VARCHAR, max_length=65535)
        add(
            "text",
            DataType.VARCHAR,
            max_length=65535,
            enable_analyzer=True,
            enable_match=True,
            analyzer_params=analyzer_with_dictionary(self._settings.analyzer, self._vocabulary()),
        )
        add("sparse", DataType.SPARSE_FLOAT_VECTOR)
        add("dense", DataType.FLOAT_VECTOR, dim=self._dim)
        schema.add_function(
            Function(
                name="bm25", function_type=FunctionType.BM25, input_field_names=["text"], output_field_names=["sparse"]
            )
        )
        return schema

    def _index_params(self) -> Any:
        params = self._client.prepare_index_params()
        # Nested "params" is the form both Milvus and Milvus Lite honour for M/efConstruction.
        hnsw = {"M": self._settings.hnsw_m, "efConstruction": self._settings.hnsw_ef_construction}
        params.add_index(field_name="dense", index_type="HNSW", metric_type="IP", params={"params": hnsw})
        params.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25", params={})
        return params

    # -- writes ---------------------------------------------------------------

    def upsert(self, leaves: Sequence[Chunk], vectors: np.ndarray, search_texts: Sequence[str]) -> None:
        """Writes leaves (same kb) with their vectors; the same ids overwrite."""
        if not leaves:
            return
        # the two checks below guard strata's own callers (the pipeline encodes and groups leaves per kb): a bug, not input
        if len(leaves) != len(vectors) or len(leaves) != len(search_texts):
            raise ValueError("leaves, vectors and search_texts differ in length")
        kb_ids = {leaf.kb_id for leaf in leaves}
        if len(kb_ids) != 1:  # as above: a bug, not input
            raise ValueError("upsert takes leaves of one knowledge base at a time")
        partition = self._partition_for_write(kb_ids.pop())
        rows = [leaf_row(leaf, vec, text) for leaf, vec, text in zip(leaves, vectors, search_texts)]
        for start in range(0, len(rows), _UPSERT_BATCH):
            self._call("upsert", self._name, rows[start : start + _UPSERT_BATCH], partition_name=partition)

    def delete_version(self, kb_id: str, doc_id: str, version: int) -> None:
        self._delete(kb_id, expr.eq("version_key", version_key(kb_id, doc_id, version)))

    def delete_document(self, kb_id: str, doc_id: str) -> None:
        self._delete(kb_id, expr.all_of(expr.eq("kb_id", kb_id), expr.eq("doc_id", doc_id)))

    def delete_kb(self, kb_id: str) -> None:
        self._delete(kb_id, expr.eq("kb_id", kb_id))

    def _delete(self, kb_id: str, where: str) -> None:
        partitions = self._partitions_for([kb_id])
        if partitions == []:
            return  # the kb never had a partition: nothing to delete
        # pymilvus refuses an empty partition name: on the partition-key layout the filter's kb_id prunes
        in_partition = {"partition_name": partitions[0]} if partitions else {}
        self._call("delete", self._name, filter=where, **in_partition)

    def flush(self) -> None:
        """Seals written rows: unflushed rows make Lite searches 10-100x slower. Waits for them to be sealed,
        minutes after a large document on a loaded server: cut at ``STRATA_MILVUS__FLUSH_TIMEOUT_S``."""
        self._call("flush", self._name, timeout=self._flush_timeout)

    # -- reads ----------------------------------------------------------------

    def count(self, kb_id: str, *, doc_id: str | None = None, version: int | None = None) -> int:
        """Leaves of a kb, or of one document (version)."""
        partitions = self._partitions_for([kb_id])
        if partitions == []:
            return 0
        if doc_id is not None and version is not None:
            where = expr.eq("version_key", version_key(kb_id, doc_id, version))
        else:
            where = expr.all_of(expr.eq("kb_id", kb_id), expr.eq("doc_id", doc_id) if doc_id is not None else None)
        if self.on_lite:
            return self._lite_count(where, partitions, whole_kb=doc_id is None)
        # Strong: the indexer counts right after its flush, and a Bounded read on a server may miss those rows
        rows = self._call(
            "query",
            self._name,
            filter=where,
            output_fields=["count(*)"],
            partition_names=partitions,
            consistency_level="Strong",
            timeout=self._count_timeout,
        )
        return int(rows[0]["count(*)"]) if rows else 0

    def count_versions(self, kb_id: str, versions: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Leaves of each ``(doc_id, version)`` of a kb, in one read of their ids' version keys (the indexer's
        check of a written group: a filtered count per document made indexing quadratic on Milvus Lite, whose
        filtered reads scan every row, and cost a round trip per document on a server). A group holding more
        leaves than one read returns (``QUERY_WINDOW``) is counted version by version."""
        partitions = self._partitions_for([kb_id])
        found = dict.fromkeys(versions, 0)
        if partitions == [] or not versions:
            return found
        keys = {version_key(kb_id, d, v): (d, v) for d, v in versions}
        window = {} if self.on_lite else {"limit": QUERY_WINDOW, "consistency_level": "Strong"}
        rows = self._call(
            "query",
            self._name,
            filter=expr.in_("version_key", sorted(keys)),
            output_fields=["version_key"],
            partition_names=partitions,
            timeout=self._count_timeout,
            **window,
        )
        if not self.on_lite and len(rows) >= QUERY_WINDOW:
            return {(d, v): self.count(kb_id, doc_id=d, version=v) for d, v in versions}
        for row in rows:
            found[keys[row["version_key"]]] += 1
        return found

    def ping(self) -> dict[str, Any]:
        """One metadata call to the server, cut at the search timeout (readiness: no count, no data read);
        raises ``StoreError`` when the server does not answer or the collection is gone."""
        if not self._call("has_collection", self._name, timeout=self._search_timeout):
            raise StoreError(f"Milvus collection {self._name!r} does not exist (dropped after it was opened?)")
        return {"collection": self._name}

    def _lite_count(self, where: str, partitions: list[str] | None, *, whole_kb: bool) -> int:
        """Milvus Lite answers ``count(*)`` under a filter by materialising every matching row, vectors
        included (5 GB for 200,000 leaves): a kb in a partition of its own is counted from ids alone,
        anything else by its ids."""
        if whole_kb and partitions:
            return int(self._call("get_partition_stats", self._name, partitions[0])["row_count"])
        if whole_kb and self._kb is not None:
            return int(self._call("get_collection_stats", self._name)["row_count"])
        rows = self._call(
            "query",
            self._name,
            filter=where,
            output_fields=["chunk_id"],
            partition_names=partitions,
            timeout=self._count_timeout,
        )
        return len(rows)

    def leaf_ids(self, kb_id: str) -> dict[str, tuple[str, int]]:
        """Every leaf of a kb in the collection: chunk id -> (doc id, version)."""
        partitions = self._partitions_for([kb_id])
        if partitions == []:
            return {}
        found: dict[str, tuple[str, int]] = {}
        try:
            iterator = self._client.query_iterator(
                self._name,
                batch_size=4096,
                filter=expr.eq("kb_id", kb_id),
                output_fields=["chunk_id", "doc_id", "version"],
                partition_names=partitions,
                timeout=self._count_timeout,
                consistency_level="Strong",
            )
            while batch := iterator.next():
                found.update({r["chunk_id"]: (r["doc_id"], int(r["version"])) for r in batch})
            iterator.close()
        except MilvusException as exc:
            raise StoreError(f"Milvus query_iterator on {self._name!r} failed: {exc}") from exc
        return found

    def present(self, kb_id: str, chunk_ids: Sequence[str]) -> set[str]:
        """Which of ``chunk_ids`` the collection holds for ``kb_id`` (by primary key, a batch at a time, no
        vector read): the consistency probe of ``strata stats`` and of an indexing run's start."""
        partitions = self._partitions_for([kb_id])
        ids = list(dict.fromkeys(chunk_ids))
        if partitions == [] or not ids:
            return set()
        found: set[str] = set()
        for start in range(0, len(ids), _UPSERT_BATCH):
            where = self._where([kb_id], expr.in_("chunk_id", ids[start : start + _UPSERT_BATCH]))
            rows = self._call(
                "query",
                self._name,
                filter=where,
                output_fields=["chunk_id"],
                partition_names=partitions,
                consistency_level="Strong",
                timeout=self._count_timeout,
            )
            found.update(row["chunk_id"] for row in rows)
        return found

    def dense_vectors(self, kb_id: str, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """The dense vectors the collection holds for ``chunk_ids`` of ``kb_id`` (a resumed write's check)."""
        partitions = self._partitions_for([kb_id])
        ids = list(dict.fromkeys(chunk_ids))
        if partitions == [] or not ids:
            return {}
        rows = self._call(
            "query",
            self._name,
            filter=self._where([kb_id], expr.in_("chunk_id", ids)),
            output_fields=["chunk_id", "dense"],
            partition_names=partitions,
            consistency_level="Strong",
            timeout=self._count_timeout,
        )
        return {row["chunk_id"]: np.asarray(row["dense"], dtype=np.float32) for row in rows}

    def holds_any(self, kb_id: str) -> bool:
        """Whether the collection holds any leaf of ``kb_id`` (one row asked for, cut at the search timeout)."""
        partitions = self._partitions_for([kb_id])
        if partitions == []:
            return False
        rows = self._call(
            "query",
            self._name,
            filter=expr.eq("kb_id", kb_id),
            output_fields=["chunk_id"],
            limit=1,
            partition_names=partitions,
            timeout=self._search_timeout,
        )
        return bool(rows)

    def drop_collection(self) -> None:
        """Drops the whole collection (benchmarks and tests that made one of their own)."""
        self._call("drop_collection", self._name)

    def delete_leaves(self, kb_id: str, chunk_ids: Sequence[str]) -> None:
        """Deletes leaves by id (orphans found by ``strata reconcile --repair``)."""
        ids = list(chunk_ids)
        for start in range(0, len(ids), _UPSERT_BATCH):
            self._delete(kb_id, expr.in_("chunk_id", ids[start : start + _UPSERT_BATCH]))

    # -- helpers --------------------------------------------------------------

    def _where(self, kb_ids: Sequence[str] | None, where: str) -> str:
        kb_clause = None if self._use_partitions or kb_ids is None else expr.in_("kb_id", list(kb_ids))
        return expr.all_of(kb_clause, where)

    def _partitions_for(self, kb_ids: Sequence[str] | None) -> list[str] | None:
        """Partitions to search: None = the whole collection; [] = nothing to search.

        A kb written by another process after this one listed the partitions is found by listing
        them again on a miss: a kb that exists is never searched as empty.
        """
        if not self._use_partitions or kb_ids is None:
            return None
        wanted = [partition_name(k) for k in kb_ids]
        if any(p not in self._partitions for p in wanted):
            self._refresh_partitions()
        return [p for p in wanted if p in self._partitions]

    def _refresh_partitions(self) -> None:
        listed = set(self._call("list_partitions", self._name))
        with self._partitions_lock:
            self._partitions |= listed

    def _partition_for_write(self, kb_id: str) -> str | None:
        if not self._use_partitions:
            return None
        name = partition_name(kb_id)
        if name not in self._partitions:
            self._refresh_partitions()
        if name not in self._partitions:
            held = sum(1 for name in self._partitions if name != "_default")
            if held >= self._settings.max_partitions:
                raise StoreError(
                    f"knowledge base {kb_id!r} would be kb partition {held + 1:,} of Milvus collection "
                    f"{self._name!r}, over STRATA_MILVUS__MAX_PARTITIONS ({self._settings.max_partitions:,}; Milvus "
                    "refuses more than rootCoord.maxPartitionNum, 1,024 by default). Move the kbs to the collection "
                    "level (strata rebuild --to-uri URI --isolation collection) or raise both limits"
                )
            self._call("create_partition", self._name, name)
            with self._partitions_lock:
                self._partitions.add(name)
        return name

    def _cut(self, timeout: float | None) -> float:
        return self._search_timeout if timeout is None else max(0.001, min(timeout, self._search_timeout))

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout", self._timeout)
        try:
            return self._invoke(method, args, kwargs)
        except (MilvusException, grpc.RpcError) as exc:  # pymilvus lets a call's DEADLINE_EXCEEDED out raw
            if is_grpc_deadline(exc):
                limit = milvus_bound(kwargs["timeout"], self._settings)
                raise timed_out(
                    "Milvus", f"{method} on {self._name!r}", limit, address=str(self._settings.uri)
                ) from exc
            raise StoreError(f"Milvus {method} on {self._name!r} failed: {exc}") from exc

    def _invoke(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The client call; once more after loading the collection again when the server has it released:
        a restarted server may come back so (a ``milvus-lite server`` always does, as after an operator's
        ``release``), and opening the index is what loaded it."""
        call = getattr(self._client, method)
        try:
            return call(*args, **kwargs)
        except MilvusException as exc:
            if exc.code != _COLLECTION_NOT_LOADED:
                raise
            logger.warning("Milvus collection %s is not loaded (%s): loading it again", self._name, exc.message)
        self._client.load_collection(
            self._name, replica_number=self._settings.replica_number, timeout=kwargs["timeout"]
        )
        return call(*args, **kwargs)

    def close(self) -> None:
        if self._owns_client:
            self._client.close()


def analyzer_tokenizer(settings: MilvusSettings) -> str:
    """The tokenizer name of the configured BM25 analyzer (``jieba``, ``standard``...)."""
    tokenizer = settings.analyzer.get("tokenizer")
    return tokenizer.get("type", "") if isinstance(tokenizer, dict) else str(tokenizer or "")


def layout_of(described: dict[str, Any]) -> str:
    """How a collection keeps kbs apart, from ``describe_collection``: ``single`` (one kb, its ``strata.kb``
    property), ``partition_key`` (``kb_id`` is the partition key) or ``partition`` (a partition per kb)."""
    if (described.get("properties") or {}).get(KB_PROPERTY):
        return "single"
    kb_field: dict[str, Any] = next((f for f in described.get("fields", []) if f.get("name") == "kb_id"), {})
    return "partition_key" if kb_field.get("is_partition_key", False) else "partition"


_LITE_INDEX_FILE = re.compile(r"/[^\s:'\"]+\.s?idx\b")  # an index file's path in a Milvus Lite error


def lite_index_named(message: str, uri: str, collection: str) -> str | None:
    """The index file of ``collection`` in the Milvus Lite file ``uri`` that an error ``message`` names: a
    ``.idx`` or ``.sidx`` file in one of the collection's ``indexes`` folders; None when it names none."""
    root = os.path.join(os.path.abspath(uri), "collections", collection) + os.sep
    for found in _LITE_INDEX_FILE.finditer(message):
        path = os.path.normpath(os.path.abspath(found.group(0)))
        if path.startswith(root) and os.path.basename(os.path.dirname(path)) == "indexes":
            return path
    return None


# Milvus Lite's gRPC server (in this process for a ``.db`` file, or a ``milvus-lite server``) keeps grpc's
# default ping policy and answers pymilvus's 10 s keepalive pings with GOAWAY "too_many_pings", which fails
# the call in flight; loopback needs no keepalive. Milvus standalone permits them: it keeps pymilvus's.
_NO_KEEPALIVE = {"grpc.keepalive_time_ms": 2**31 - 1, "grpc.keepalive_permit_without_calls": 0}
# After each refused connection grpc waits longer before it tries again (1 s, x1.6, up to 120 s): under steady
# queries, a server back from a 10 s outage was tried again only 5-7 s after it answered, and every query
# failed meanwhile. pymilvus's recovery (a new channel on UNAVAILABLE) did not help: by default the new
# channel takes the same waiting connection from grpc's process-wide subchannel pool. A pool of the
# channel's own makes that new channel try at once, and a 1 s cap bounds the wait of the channel itself.
_RECONNECT = {
    "grpc.use_local_subchannel_pool": 1,
    "grpc.initial_reconnect_backoff_ms": 250,
    "grpc.max_reconnect_backoff_ms": 1000,
}


def milvus_client(settings: MilvusSettings) -> MilvusClient:
    """A client of the configured Milvus with the connection options its kind of server needs."""
    return connect(settings)[0]


def connect(settings: MilvusSettings) -> tuple[MilvusClient, bool]:
    """The client (``milvus_client``) and whether the other end is Milvus Lite: a ``.db`` file, or a
    ``milvus-lite server`` (its version says so; asked once, here).

    The connection is the client's own, closed with it: pymilvus would otherwise share one channel per
    address, made with the options of whichever client came first, and keep it after its last client
    closed. A Milvus Lite file's server gets a new loopback port each time a process opens it, so a kept
    channel to a port a released server had, reused when a later server gets that port, fails with
    "connection refused" (seen in the test suite)."""
    uri = str(settings.uri)
    if settings.is_lite:
        os.makedirs(os.path.dirname(os.path.abspath(uri)), exist_ok=True)
        return _client(settings, dedicated=True, grpc_options=_NO_KEEPALIVE | _RECONNECT), True
    client = _client(settings, dedicated=True, grpc_options=_RECONNECT)
    try:
        lite_server = str(client.get_server_version(timeout=settings.timeout_s)).startswith("milvus_lite")
    except MilvusException as exc:
        client.close()
        raise _connect_error(settings, exc) from exc
    if not lite_server:
        return client, False
    client.close()
    return _client(settings, dedicated=True, grpc_options=_NO_KEEPALIVE | _RECONNECT), True


def _connect_error(settings: MilvusSettings, exc: MilvusException) -> StoreError:
    """A failed connection to a server: no channel within the client's timeout (refused or hung) names the
    setting."""
    uri = str(settings.uri)
    if not settings.is_lite and (exc.code == _CONNECT_FAILED or is_grpc_deadline(exc)):
        return timed_out(
            "Milvus", "a new connection", Bound(settings.timeout_s, "STRATA_MILVUS__TIMEOUT_S"), address=uri
        )
    return StoreError(f"cannot connect to Milvus at {uri}: {exc}")


def _client(settings: MilvusSettings, **options: Any) -> MilvusClient:
    uri = str(settings.uri)
    try:
        return MilvusClient(uri=uri, token=settings.token.get_secret_value(), timeout=settings.timeout_s, **options)
    except MilvusException as exc:
        if settings.is_lite and not _lite_served_here(uri) and _lite_file_locked(uri):
            raise IndexLockedError(
                f"the Milvus Lite file {uri} is open in another process (a running `strata serve`, `strata index`, "
                "`strata eval` or a service calling retrieve_documents?). Milvus Lite allows one process per file: "
                "when it is `strata serve`, index through it with `strata index PATH --kb NAME --server "
                "http://127.0.0.1:8080`; otherwise stop that process first, or use a Milvus server "
                "(STRATA_MILVUS__URI=http://host:19530)."
            ) from exc
        raise _connect_error(settings, exc) from exc


def _lite_served_here(uri: str) -> bool:
    """Whether this process serves the Milvus Lite file (its own lock is then no other process's)."""
    try:
        from milvus_lite import server_manager_instance
    except ImportError:
        return False
    return os.path.abspath(uri) in getattr(server_manager_instance, "_servers", {})


def _lite_file_locked(uri: str) -> bool:
    lock_path = os.path.join(os.path.abspath(uri), "LOCK")
    if not os.path.exists(lock_path):
        return False
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)
