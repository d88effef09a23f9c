"""What identifies a configuration: for the query-cache key and for sharing Retrievers.

``config_fingerprint`` lists everything besides the query and the index
generation that decides a result: the retrieval, chunking and rerank
settings, the query encoder and the stores' identity. Two deployments that
share one Redis (even with the default key prefix) therefore never share
cache entries. ``settings_fingerprint`` covers every setting, secrets
included (hashed), unlike ``model_dump_json`` which masks them all alike.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import SecretStr
from strata.config import Settings
from strata.stores.keys import database_identity


def config_fingerprint(settings: Settings) -> dict[str, Any]:
    rerank = settings.rerank
    return {
        "retrieval": settings.retrieval.model_dump(mode="json", exclude={"cache_size", "cache_ttl_s", "cache_retry_after_s"}),
        "chunking": settings.chunking.model_dump(mode="json"),
        "rerank": {"url": rerank.url, "provider": rerank.provider, "model": rerank.model, "top_n": rerank.top_n},
        "encoder": {"provider": settings.embedding.provider, "model": settings.embedding.model},
        "stores": {
            "milvus": [str(settings.milvus.uri), settings.milvus.collection],
            "database": database_identity(str(settings.database.url)),
            "key_prefix": settings.redis.key_prefix,
        },
    }


def settings_fingerprint(settings: Settings) -> str:
    blob = json.dumps(settings.model_dump(), sort_keys=True, default=_secret_aware)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def _secret_aware(value: Any) -> str:
    if isinstance(value, SecretStr):
        return "secret:" + hashlib.sha256(value.get_secret_value().encode("utf-8")).hexdigest()
    return str(value)
