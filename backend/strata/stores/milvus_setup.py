"""Opening one leaf collection: created with its schema and indexes when missing, checked, loaded.

A collection belongs to one encoder identity: the encoder name and dimension
are recorded as collection properties and a mismatch is refused, as is a
configured BM25 analyzer other than the one the collection was built with.
Each leaf has a dense vector (HNSW/IP) and a BM25 sparse vector computed by
Milvus from the analyzed ``text`` field. How the collection keeps kbs apart
(its layout) is read from its schema and properties (``layout_of``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pymilvus import DataType, Function, FunctionType, MilvusClient
from pymilvus.exceptions import MilvusException

from strata.errors import ConfigError, EncoderMismatchError, StoreError, UnsupportedAnalyzer
from strata.stores.analyzer import lite_analyzer_problem
from strata.stores.leaf_schema import analyzer_identity, analyzer_of, analyzer_with_dictionary, dictionary_of
from strata.stores.milvus_calls import CollectionCalls

logger = logging.getLogger(__name__)

ENCODER_PROPERTY = "strata.encoder"
DIM_PROPERTY = "strata.dim"
KB_PROPERTY = "strata.kb"  # the one kb of a collection of the ``collection`` isolation level


@dataclass(frozen=True)
class CollectionSpec:
    """What a leaf collection must be: its encoder, its kb (``single``), and how a new one keeps kbs apart."""

    encoder_name: str
    dim: int
    kb_id: str | None  # the collection holds this kb alone (None: a shared collection)
    new_partitions: bool  # a collection created now has a partition per kb (else kb_id is the partition key)
    vocabulary: Callable[[], Iterable[str]]  # terms the jieba analyzer of a new collection keeps whole


@dataclass(frozen=True)
class OpenedCollection:
    """An opened collection's layout, its analyzer's dictionary and, on the ``partition`` layout, its partitions."""

    layout: str
    dictionary: frozenset[str]
    partitions: frozenset[str]


def open_collection(calls: CollectionCalls, spec: CollectionSpec) -> OpenedCollection:
    """Opens the collection, creating it (and its indexes, if its creator stopped before them) when missing;
    raises ``EncoderMismatchError``, ``ConfigError`` or ``StoreError`` for one that is not ``spec``'s."""
    client, name, timeout = calls.client, calls.name, calls.settings.timeout_s
    try:
        if not client.has_collection(name, timeout=timeout):
            try:
                _create_collection(calls, spec)
            except MilvusException:
                if not client.has_collection(name, timeout=timeout):
                    raise  # else another process (a second worker) created it meanwhile: open theirs
        if not client.list_indexes(name, timeout=timeout):  # its creator stopped before them
            client.create_index(name, _index_params(calls), timeout=timeout, sync=False)
        described = client.describe_collection(name, timeout=timeout)
        _check_identity(calls, spec, described)
        _check_analyzer(calls, described)
        layout = _checked_layout(calls, spec, described)
        dictionary = dictionary_of(described)
        _load(calls)
        partitions = frozenset(client.list_partitions(name, timeout=timeout)) if layout == "partition" else frozenset()
    except MilvusException as exc:
        raise StoreError(f"Milvus collection {name!r} could not be opened: {exc}") from exc
    return OpenedCollection(layout, dictionary, partitions)


def layout_of(described: dict[str, Any]) -> str:
    """How a collection keeps kbs apart, from ``describe_collection``: ``single`` (one kb, its ``strata.kb``
    property), ``partition_key`` (``kb_id`` is the partition key) or ``partition`` (a partition per kb)."""
    if (described.get("properties") or {}).get(KB_PROPERTY):
        return "single"
    kb_field: dict[str, Any] = next((f for f in described.get("fields", []) if f.get("name") == "kb_id"), {})
    return "partition_key" if kb_field.get("is_partition_key", False) else "partition"


def _load(calls: CollectionCalls) -> None:
    """Loads the collection; on a Milvus Lite file, again after removing each index file it could not read.

    Milvus Lite builds a segment's index after a flush and writes it in place (``faiss.write_index``), so a
    process killed meanwhile leaves a truncated ``.idx`` file that every later open failed on ("read error
    in ...dense.hnsw.idx"). An index file is derived from its segment's rows: removed, Lite builds it again
    from them. Only a file the error names, in this collection's own ``indexes`` folders, is removed, and
    each at most once.
    """
    settings = calls.settings
    removed: set[str] = set()
    while True:
        try:
            calls.client.load_collection(calls.name, replica_number=settings.replica_number, timeout=settings.timeout_s)
            return
        except MilvusException as exc:
            named = lite_index_named(str(exc), str(settings.uri), calls.name) if settings.is_lite else None
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


def _check_identity(calls: CollectionCalls, spec: CollectionSpec, described: dict[str, Any]) -> None:
    props = described.get("properties") or {}
    dense_dim = next((int(f["params"]["dim"]) for f in described.get("fields", []) if f.get("name") == "dense"), None)
    built_name = props.get(ENCODER_PROPERTY, "<unknown encoder>")
    built_dim = int(props.get(DIM_PROPERTY) or dense_dim or 0)
    if built_name != spec.encoder_name or built_dim != spec.dim or dense_dim != spec.dim:
        raise EncoderMismatchError(
            f"Milvus collection {calls.name!r} was built with encoder {built_name} (dim {built_dim}); "
            f"the configured encoder is {spec.encoder_name} (dim {spec.dim}). Use another collection "
            f"(STRATA_MILVUS__COLLECTION) or rebuild the knowledge bases with this encoder."
        )


def _check_analyzer(calls: CollectionCalls, described: dict[str, Any]) -> None:
    """Refuses a configured analyzer other than the one the collection's BM25 index was built with: Milvus
    keeps the collection's, while strata's term statistics and query pruning would follow the setting."""
    built = analyzer_of(described)
    configured = calls.settings.analyzer
    if built is None or analyzer_identity(built) == analyzer_identity(configured):
        return
    raise ConfigError(
        f"STRATA_MILVUS__ANALYZER is {json.dumps(configured, ensure_ascii=False)}, but Milvus "
        f"collection {calls.name!r} was built with {json.dumps(analyzer_identity(built), ensure_ascii=False)}: "
        "its BM25 index keeps that analyzer. Set STRATA_MILVUS__ANALYZER back to it, or copy the knowledge bases "
        "into a new collection built with the new one (strata rebuild --kb KB --collection NAME)"
    )


def _checked_layout(calls: CollectionCalls, spec: CollectionSpec, described: dict[str, Any]) -> str:
    """The layout the collection was built with (``layout_of``), whatever a setting says for new collections:
    the same collection reached through a Lite file and through a server (or after ``strata rebuild``) is used
    the one way it was created (``LeafIndex`` refuses a setting naming another)."""
    layout = layout_of(described)
    name, kb = calls.name, spec.kb_id
    if (kb is not None) != (layout == "single"):
        raise StoreError(
            f"Milvus collection {name!r} keeps knowledge bases apart by {layout}, not as the collection of "
            f"knowledge base {kb!r}"
            if kb is not None
            else f"Milvus collection {name!r} is the collection of one knowledge base, not a shared one"
        )
    if kb is not None and (owner := (described.get("properties") or {}).get(KB_PROPERTY)) != kb:
        raise StoreError(f"Milvus collection {name!r} holds knowledge base {owner!r}, not {kb!r}")
    return layout


def _create_collection(calls: CollectionCalls, spec: CollectionSpec) -> None:
    settings, name, timeout = calls.settings, calls.name, calls.settings.timeout_s
    if calls.on_lite and (problem := lite_analyzer_problem(settings.analyzer)):
        raise UnsupportedAnalyzer(f"STRATA_MILVUS__ANALYZER: {problem}")
    logger.info("creating Milvus collection %s (%s, dim %d)", name, spec.encoder_name, spec.dim)
    calls.client.create_collection(
        name,
        schema=_schema(calls, spec),
        properties={
            ENCODER_PROPERTY: spec.encoder_name,
            DIM_PROPERTY: str(spec.dim),
            **({KB_PROPERTY: spec.kb_id} if spec.kb_id else {}),
        },
        timeout=timeout,
    )
    # sync=False: the collection is empty, and pymilvus's wait for the build sleeps 0.5 s per index (a new
    # kb's collection in 15 ms instead of 1 s); loading it (``open_collection``) needs the index only declared
    calls.client.create_index(name, _index_params(calls), timeout=timeout, sync=False)


def _schema(calls: CollectionCalls, spec: CollectionSpec) -> Any:
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    add = schema.add_field
    add("chunk_id", DataType.VARCHAR, is_primary=True, max_length=64)
    add("kb_id", DataType.VARCHAR, max_length=256, is_partition_key=not spec.new_partitions and spec.kb_id is None)
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
        analyzer_params=analyzer_with_dictionary(calls.settings.analyzer, spec.vocabulary()),
    )
    add("sparse", DataType.SPARSE_FLOAT_VECTOR)
    add("dense", DataType.FLOAT_VECTOR, dim=spec.dim)
    schema.add_function(
        Function(
            name="bm25", function_type=FunctionType.BM25, input_field_names=["text"], output_field_names=["sparse"]
        )
    )
    return schema


def _index_params(calls: CollectionCalls) -> Any:
    params = calls.client.prepare_index_params()
    # Nested "params" is the form both Milvus and Milvus Lite honour for M/efConstruction.
    hnsw = {"M": calls.settings.hnsw_m, "efConstruction": calls.settings.hnsw_ef_construction}
    params.add_index(field_name="dense", index_type="HNSW", metric_type="IP", params={"params": hnsw})
    params.add_index(field_name="sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25", params={})
    return params


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
