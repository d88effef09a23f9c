"""Parent fetch: round trips per auto-merge round and latency at 10 / 50 / 200 parents.

Each auto-merge round fetches its parents with one ``CachedChunks.get_many``:
one cache round trip (Redis MGET) and at most one SQL query for the misses.
Counted on the real servers (Redis INFO commandstats, SQLAlchemy statement
events) and timed cold (cache empty: cache miss + SQL + backfill) and warm
(all from the cache), for Redis + PostgreSQL, Redis + SQLite and the
in-process cache + SQLite.

    python scripts/bench_parents.py [--pg postgresql+psycopg://postgres@127.0.0.1:5432/test] [--redis redis://127.0.0.1:6379/0]
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

import redis
from sqlalchemy import event

from _bench import machine, p, quiet_logging, timed_ms
from strata.config import DatabaseSettings, RedisSettings
from strata.stores.chunk_cache import LocalChunkCache, RedisChunkCache
from strata.stores.chunk_reads import CachedChunks
from strata.stores.sql import DocumentStore, DocumentVersion
from strata.types import Chunk

REPEATS = 30


def parents(kb: str, n: int) -> list[Chunk]:
    text = "父块文本，包含若干句子。" * 40  # ~480 characters, an L2-sized parent
    return [
        Chunk(
            f"{kb}-p{i}",
            kb,
            f"doc{i // 20}",
            1,
            2,
            f"{kb}-r{i // 20}",
            f"{kb}-r{i // 20}",
            i,
            text,
            "A > B",
            0,
            len(text),
            4,
        )
        for i in range(n)
    ]


def setup(store: DocumentStore, kb: str, n: int) -> list[tuple[str, str]]:
    chunks = parents(kb, n)
    store.kbs.ensure_kb(kb, encoder="bench", dim=1, chunking="x")
    by_doc: dict[str, list[Chunk]] = {}
    for c in chunks:
        by_doc.setdefault(c.doc_id, []).append(c)
    for doc_id, doc_chunks in by_doc.items():
        store.versions.write_pending(DocumentVersion(kb, doc_id, 1, f"{doc_id}.md", "h"), doc_chunks)
    return [(kb, c.chunk_id) for c in chunks]


def run(label: str, store: DocumentStore, cache_factory, redis_client) -> None:
    statements: list[str] = []
    event.listen(store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    for n in (10, 50, 200):
        cold, warm, trips, sql = [], [], set(), set()
        for _ in range(REPEATS):
            kb = f"bench-{uuid.uuid4().hex[:6]}"
            refs = setup(store, kb, n)
            cached = CachedChunks(cache_factory(), store.chunks)
            statements.clear()
            mget_before = _mgets(redis_client)
            t, fetch = timed_ms(lambda: cached.get_many(refs))
            selects = sum(1 for s in statements if s.lstrip().upper().startswith("SELECT"))
            trips.add((fetch.cache_round_trips, _mgets(redis_client) - mget_before if redis_client else "no Redis"))
            sql.add(selects)
            cold.append(t)
            warm.append(timed_ms(lambda: cached.get_many(refs))[0])
            store.kbs.drop_kb(kb)
        print(
            f"{label:26} {n:4d} parents: cold p50 {p(cold, 50):6.2f} ms (p95 {p(cold, 95):6.2f}), "
            f"warm p50 {p(warm, 50):6.2f} ms; cache round trips {sorted(trips)}, SQL queries {sorted(sql)}"
        )


def _mgets(client) -> int:
    if client is None:
        return 0
    return int(client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args()
    quiet_logging()
    prefix = f"strata-bench-{uuid.uuid4().hex[:6]}"
    redis_settings = RedisSettings(url=args.redis, key_prefix=prefix)
    client = redis.Redis.from_url(args.redis)
    print(f"machine: {machine()}; {REPEATS} repeats per size; (cache trips counted by strata, MGETs seen by Redis)")
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = DocumentStore(DatabaseSettings(url=f"sqlite:///{Path(tmp) / 'b.sqlite3'}"))
        pg = DocumentStore(DatabaseSettings(url=args.pg))
        run("Redis + PostgreSQL", pg, lambda: RedisChunkCache(redis_settings), client)
        run("Redis + SQLite", sqlite, lambda: RedisChunkCache(redis_settings), client)
        run("in-process + SQLite", sqlite, lambda: LocalChunkCache(10000), None)
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)


if __name__ == "__main__":
    main()
