"""What identifies a configuration: for the query-cache key and for sharing Retrievers.

``config_fingerprint`` is every setting, by dotted name, except those listed
in ``NOT_IN_RESULT``: the settings known not to change what a query returns
(timeouts, pool and cache sizes, the service's own knobs, secrets). A new
setting is therefore in the cache key until someone argues it out; the stores'
identity is in it too, so two deployments that share one Redis (even with the
default key prefix) never share cache entries. ``settings_fingerprint`` covers
every setting, secrets included (hashed), unlike ``model_dump_json`` which
masks them all alike.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic_core import to_jsonable_python

from strata.config import Settings
from strata.stores.keys import database_identity

# Settings that never change a query's result, as dotted names; every other setting is in the cache key.
NOT_IN_RESULT: frozenset[str] = frozenset(
    {
        # the process and where its files go (data_dir shows in milvus.uri and database.url, which are in the key)
        "environment",
        "data_dir",
        "log_level",
        "log.format",
        "log.query_text",
        "otel.enabled",
        # timeouts, retries, pools and replicas: a result that ran out of time is degraded and never cached
        "milvus.token",
        "milvus.timeout_s",
        "milvus.search_timeout_s",
        "milvus.count_timeout_s",
        "milvus.flush_timeout_s",
        "milvus.replica_number",
        "milvus.lite_in_process",
        "database.echo",
        "database.pool_size",
        "database.connect_timeout_s",
        "database.query_timeout_s",
        "embedding.api_key",
        "embedding.device",
        "embedding.batch_size",
        "embedding.timeout_s",
        "embedding.max_retries",
        "embedding.query_timeout_s",
        "embedding.query_max_retries",
        "rerank.api_key",
        "rerank.connect_timeout_s",
        "rerank.read_timeout_s",
        "rerank.max_retries",
        # the caches themselves (key_prefix, which keeps deployments apart, stays in the key)
        "redis.url",
        "redis.ttl_s",
        "redis.connect_timeout_s",
        "redis.socket_timeout_s",
        "redis.local_cache_size",
        "redis.retry_after_s",
        "retrieval.cache_size",
        "retrieval.cache_ttl_s",
        # limits on a request and how concurrent requests are gathered: a request within them gets the same answer
        "retrieval.deadline_ms",
        "retrieval.max_top_k",
        "retrieval.max_query_chars",
        "retrieval.batch_window_ms",
        "retrieval.batch_max",
        # the HTTP service and the remote-indexing client
        "api.host",
        "api.port",
        "api.api_key",
        "api.keys",
        "api.keys_file",
        "api.max_upload_bytes",
        "api.max_concurrency",
        "api.queue_timeout_s",
        "api.body_timeout_s",
        "api.request_id_header",
        "api.ready_cache_s",
        "api.max_concurrency_per_key",
        "api.header_timeout_s",
        "api.keep_alive_s",
        "api.max_connections",
        "api.write_timeout_s",
        "api.max_pipelined_requests",
        "api.send_buffer_bytes",
        "server.url",
        "server.api_key",
        "server.timeout_s",
    }
)


def config_fingerprint(settings: Settings) -> dict[str, Any]:
    """Every setting that can change a result (all but ``NOT_IN_RESULT``), by dotted name; no password."""
    return {name: _identity(name, value) for name, value in setting_values(settings) if name not in NOT_IN_RESULT}


def setting_values(model: BaseModel, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every setting of ``model`` as (dotted name, value), descending into the sections."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            yield from setting_values(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def _identity(name: str, value: Any) -> Any:
    if name == "database.url":
        return database_identity(str(value))  # which database, without its password
    return to_jsonable_python(value)


def settings_fingerprint(settings: Settings) -> str:
    blob = json.dumps(settings.model_dump(), sort_keys=True, default=_secret_aware)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _secret_aware(value: Any) -> str:
    if isinstance(value, SecretStr):
        return "secret:" + hashlib.sha256(value.get_secret_value().encode("utf-8")).hexdigest()
    return str(value)
