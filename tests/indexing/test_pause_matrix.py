"""The pause matrix: an indexer paused right before each store call of its run, its lease taken by a newer
run that finishes, then continued. In every cell the newer content serves, the stores agree (``reconcile``
finds no difference: no leaf missing, no orphan, no stale cache entry, no leftover version) and a paused
run that still had a write to make stops with ``LeaseLostError``.

The cells are not listed by hand: a first run records every call the indexer makes on the stores
(``STORES``: SQL's parts, the Milvus leaf index, the parent cache), reads and writes, in the order it first
makes them; the matrix pauses before the first of each. A store call added to the indexer joins the matrix.

Run A is paused in process: its thread blocks in the call's wrapper and its lease's renewal thread is
stopped, as SIGSTOP would stop both (``tests/indexing/test_fenced_writes.py`` pauses whole ``strata index``
processes at the write steps). Every run starts with a pending version a crashed run left of B's files.
Run B reads either the same files as A (``same``: A continues the leftover, and B could continue A's
pending versions) or newer ones (``newer``: A deletes the leftover that B could continue, the case where
a late delete once emptied the newer run's version; A's content must not serve). On PostgreSQL and a Milvus server, with Redis as the shared cache.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from strata.errors import LeaseLostError
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from strata.stores.lease import KbLease
from tests.support.documents import write_files
from tests.support.processes import wait_for
from tests.support.retrieval import texts
from tests.support.stores import REDIS_URL, fresh_pg_database, opened, settings_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.milvus_server, pytest.mark.cost(90)]

DOCS = 3
STORES = (
    "documents.kbs",
    "documents.versions",
    "documents.chunks",
    "documents.terms",
    "documents.embeddings",
    "documents.invalidations",
    "leaf_index",
    "cached_chunks",
)
LEASE_TTL_S = 1.0


def notes(era: str) -> dict[str, str]:
    return {
        f"note{n}.md": f"# Note {n}\n\nIn the {era} era the lamp of tower {n} burned {era} oil.\n\n"
        f"## Keeper\n\nThe keeper of tower {n} in the {era} era wrote {era} logs every night.\n"
        for n in range(DOCS)
    }


class Crash(Exception):
    """Raised by the crashed run's seam: the run stops with its versions pending, as a killed run leaves them."""


def crash_after_flush(step: str) -> None:
    if step == "milvus_flush":
        raise Crash(step)


class Paused:
    """Blocks run A right before the first call of ``target`` (store, method) until ``resume``."""

    def __init__(self, target: tuple[str, str] | None, lease: Callable[[], KbLease]) -> None:
        self.target = target
        self._lease = lease
        self.reached = threading.Event()
        self.resume = threading.Event()
        self.calls: list[tuple[str, str]] = []

    def before(self, call: tuple[str, str]) -> None:
        if call not in self.calls:
            self.calls.append(call)
        if call == self.target and not self.reached.is_set():
            self._lease()._stop.set()  # a stopped process renews nothing: its renewal thread stops too
            self.reached.set()
            assert self.resume.wait(300), "run A was never continued"


def watch_stores(resources: Resources, paused: Paused) -> None:
    """Every public method of every store in ``STORES`` calls ``paused.before`` first (on these objects only)."""
    for path in STORES:
        store: Any = resources
        for part in path.split("."):
            store = getattr(store, part)
        for name in dir(type(store)):
            method = getattr(store, name, None)
            if name.startswith("_") or not callable(method) or name in ("close", "dispose"):
                continue
            setattr(store, name, _watched(method, (path, name), paused))


def _watched(method: Callable[..., Any], call: tuple[str, str], paused: Paused) -> Callable[..., Any]:
    @functools.wraps(method)
    def watched(*args: Any, **kwargs: Any) -> Any:
        paused.before(call)
        return method(*args, **kwargs)

    return watched


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str) -> Iterator[dict[str, str]]:
    with fresh_pg_database() as pg:
        yield {
            "STRATA_DATA_DIR": str(tmp_path_factory.mktemp("pause-data")),
            "STRATA_DATABASE__URL": pg,
            "STRATA_MILVUS__URI": milvus_server_uri,
            "STRATA_MILVUS__COLLECTION": f"paused_{uuid.uuid4().hex[:8]}",
            "STRATA_REDIS__URL": REDIS_URL,
            "STRATA_REDIS__KEY_PREFIX": f"pause-{uuid.uuid4().hex[:8]}",
        }


class Cell:
    """One cell's kb, folder and stores: B's ``Resources`` (and the setup's) and A's, watched."""

    def __init__(self, env: dict[str, str], root: Path, kb: str, encoder: Any) -> None:
        self.env, self.kb, self.encoder = env, kb, encoder
        self.docs = root / kb

    def prepare(self, resources: Resources, leftover: str) -> None:
        """The kb serves its first version; a crashed run left a pending version of every document, of the
        ``leftover`` era: B's, so B could continue it, while A (reading other files) deletes it, or A's, which A
        continues."""
        write_files(self.docs, notes("first"))
        assert Indexer(resources).index_paths([self.docs], kb_id=self.kb).added == DOCS
        write_files(self.docs, notes(leftover))
        with pytest.raises(Crash):
            Indexer(resources, after_write_step=crash_after_flush).index_paths([self.docs], kb_id=self.kb)

    def run_a(self, target: tuple[str, str] | None) -> tuple[Paused, threading.Thread, list[BaseException]]:
        """Run A in a thread of its own, with stores of its own, paused before ``target``."""
        write_files(self.docs, notes("older"))
        failures: list[BaseException] = []
        ready = threading.Event()
        holder: dict[str, Indexer] = {}
        paused = Paused(target, lambda: holder["indexer"].lease(self.kb))

        def run() -> None:
            with opened(settings_for(self.env), self.encoder) as resources:
                _ = resources.leaf_index, resources.cached_chunks  # built before they are watched
                watch_stores(resources, paused)
                holder["indexer"] = Indexer(resources, lease_ttl_s=LEASE_TTL_S)
                ready.set()
                try:
                    holder["indexer"].index_paths([self.docs], kb_id=self.kb)
                except BaseException as exc:  # what the paused run ends with is the test's to judge
                    failures.append(exc)

        thread = threading.Thread(target=run, name="run-a", daemon=True)
        thread.start()
        assert ready.wait(60)
        return paused, thread, failures


def lease_free(resources: Resources, kb: str) -> bool:
    from sqlalchemy import select

    from strata.stores.sql_schema import kb_leases

    db = resources.documents.db
    with db.connect() as conn:
        row = conn.execute(select(kb_leases.c.expires_at).where(kb_leases.c.kb_id == kb)).first()
    return row is None or row.expires_at < db.now()


def play(cell: Cell, resources: Resources, target: tuple[str, str], newer: str) -> list[str]:
    """One cell: A paused before ``target``, B indexes ``newer`` and serves, A continued. What went wrong."""
    cell.prepare(resources, newer)
    paused, thread, failures = cell.run_a(target)
    wrong: list[str] = []
    try:
        if not wait_for(lambda: paused.reached.is_set() or not thread.is_alive(), within_s=180):
            return ["run A never reached the call"]
        if not paused.reached.is_set():
            return [f"run A never called {target} (it ended: {failures})"]
        assert wait_for(lambda: lease_free(resources, cell.kb), within_s=60), "A's lease never expired"
        write_files(cell.docs, notes(newer))
        report = Indexer(resources).index_paths([cell.docs], kb_id=cell.kb)
        # with the same files, B finds unchanged what A served before it was paused
        if report.failed or report.updated + report.unchanged != DOCS or (newer != "older" and report.unchanged):
            wrong.append(f"run B: {report.updated} updated, {report.unchanged} unchanged, {report.failed} failed")
    finally:
        paused.resume.set()
        thread.join(180)
    if thread.is_alive():
        return [*wrong, "run A did not end after it was continued"]
    if failures and not isinstance(failures[0], LeaseLostError):
        wrong.append(f"run A ended with {type(failures[0]).__name__}: {failures[0]}")
    return wrong + served_wrong(resources, cell.kb, newer)


def served_wrong(resources: Resources, kb: str, era: str) -> list[str]:
    """What is wrong with what the kb serves: versions, stores' agreement, the answer's text."""
    wrong = []
    served = [v for v in resources.documents.versions.of_kb(kb) if v.status == "active"]
    if len(served) != DOCS:
        wrong.append(f"{len(served)} documents serve, not {DOCS}")
    check = Indexer(resources).reconcile(kb)
    if check.differences:
        wrong.append(f"reconcile: {check.to_dict()}")
    answer = Retriever(resources, warm_up_first=False).retrieve(
        "Which oil did the lamp of tower 1 burn?", 3, kb_ids=[kb]
    )
    if answer.meta.status != "ok" or not texts(answer) or not all(f"{era} oil" in t for t in texts(answer)[:1]):
        wrong.append(f"answer {answer.meta.status}: {texts(answer)[:1]}")
    return wrong


def calls_of_a_run(env: dict[str, str], root: Path, kb: str, leftover: str, encoder: Any) -> list[tuple[str, str]]:
    """Every store call run A makes when nothing pauses it, in the order it first makes each."""
    cell = Cell(env, root, kb, encoder)
    with opened(settings_for(env), encoder) as resources:
        cell.prepare(resources, leftover)
        paused, thread, failures = cell.run_a(None)
        thread.join(180)
    assert not failures, failures
    return paused.calls


@pytest.mark.parametrize("newer", ["same", "newer"])
def test_a_run_paused_before_any_store_call_cannot_harm_the_run_that_took_its_lease(
    env: dict[str, str], tmp_path: Path, memo_encoder, newer: str
) -> None:
    era = "older" if newer == "same" else "newer"
    calls = calls_of_a_run(env, tmp_path, f"recorded_{newer}", era, memo_encoder)
    assert ("leaf_index", "upsert") in calls and ("leaf_index", "delete_version") in calls, calls
    wrong = {}
    with opened(settings_for(env), memo_encoder) as resources:
        for n, call in enumerate(calls):
            cell = Cell(env, tmp_path, f"k{n}_{newer}", memo_encoder)
            found = play(cell, resources, call, era)
            if found:
                wrong[".".join(call)] = found
    assert not wrong, f"{len(wrong)} of {len(calls)} cells went wrong: {wrong}"
