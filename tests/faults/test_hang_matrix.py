"""Hang matrix: each store stopped mid-service (SIGSTOP: connections accepted, never answered), then continued.

Beside the fault matrix (each store refused), for every store in ``HUNG_STORES``:

| cell | while the store is stopped | after SIGCONT |
|---|---|---|
| a query (``POST /retrieve``, ``deadline_ms`` 1,500) | answered within the deadline plus ``MARGIN_S``, naming the store: a problem+json 503/504, or a 200 that says it is degraded and why | ``ok`` again |
| ``/ready`` | every probe answered within ``READY_BOUND_S``; soon ``degraded`` (200, never 503: the store is shared) with the store ``down``; ``strata_component_down`` says so | ``ready`` again |

``MARGIN_S`` is the stated constant past a request's deadline (docs/guide.md, "Reliability"): the largest single
wait a store call may add to it is libpq's 2 s floor on opening a new PostgreSQL connection; every other call is
cut at the deadline. One private instance of each store for the module (PostgreSQL from tests/faults/conftest.py,
a ``PrivateRedis``, a ``milvus-lite server``), one tiny kb, one app; a new store joins by a row of ``HUNG_STORES``.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from strata.api import create_app
from strata.config import Settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.faults.test_sql_timeouts import Frozen
from tests.support.documents import GARDEN_DOC
from tests.support.milvus import MilvusServerProcess
from tests.support.servers import PrivatePostgres, PrivateRedis
from tests.support.stores import make_settings, with_sections

logger = logging.getLogger(__name__)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.milvus_server, pytest.mark.cost(45)]

DEADLINE_MS = 1500
MARGIN_S = 2.0  # the stated constant: libpq's least connect_timeout, the longest wait past a deadline
READY_BOUND_S = 2.0  # STRATA_API__READY_TIMEOUT_S's default, well inside the probe's timeoutSeconds (5)
PROBE_SLACK_S = 0.5  # a probe's own work on a loaded 2-core machine, over the bound
SETTLE_S = 30.0  # bound of the polls for a state to show (a hang detected, a recovery seen)
QUERY = "how often to water tomatoes"


@dataclass(frozen=True)
class HungStore:
    """A store of the matrix: its component name in ``/ready``, the name its errors give, how to stop it."""

    component: str
    named: str
    pause: Callable[[], None]
    resume: Callable[[], None]
    answers: frozenset[int]  # the statuses a query may get while it is stopped


@dataclass
class Stack:
    client: TestClient
    stores: dict[str, HungStore]
    settings: Settings
    source: Path


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, postgres_cluster: PrivatePostgres, memo_encoder: Any
) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("hang")
    if not postgres_cluster.running():
        postgres_cluster.start()
    redis_server = PrivateRedis(root)
    redis_server.start()
    milvus = MilvusServerProcess(root / "milvus-server")
    milvus.start()
    settings = make_settings(
        root,
        postgres_cluster.create_database(),
        redis_url=redis_server.url,
        milvus={"uri": milvus.uri, "collection": f"hang_{uuid.uuid4().hex[:8]}"},
        retrieval={"cache_size": 0, "deadline_ms": 10_000},
        database={"connect_timeout_s": 5.0},
        api={"ready_cache_s": 0.0},
    )
    source = root / "garden"
    source.mkdir()
    (source / "handbook.md").write_text(GARDEN_DOC, encoding="utf-8")
    resources = Resources(settings, encoder=memo_encoder)
    frozen = Frozen(postgres_cluster)
    group = milvus.process.pid if milvus.process else 0
    stores = {
        "postgresql": HungStore("sql", "PostgreSQL", frozen.pause, frozen.resume, frozenset({200, 503, 504})),
        "redis": HungStore("redis", "Redis", redis_server.pause, redis_server.resume, frozenset({200})),
        "milvus": HungStore(
            "milvus",
            "Milvus",
            lambda: os.killpg(group, signal.SIGSTOP),
            lambda: os.killpg(group, signal.SIGCONT),
            frozenset({503, 504}),
        ),
    }
    try:
        assert Indexer(resources).index_paths([source], kb_id="garden").failed == 0
        with TestClient(create_app(settings, resources=resources, warm_up=False), raise_server_exceptions=False) as c:
            yield Stack(c, stores, settings, source)
    finally:
        frozen.resume()
        resources.close()
        redis_server.stop()
        milvus.stop()


HUNG_STORES = ["postgresql", "redis", "milvus"]


def ask(client: TestClient) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = client.post(
        "/retrieve", json={"query": QUERY, "top_k": 3, "kb_ids": ["garden"], "deadline_ms": DEADLINE_MS}
    )
    return response, time.monotonic() - started


def probe(client: TestClient, path: str = "/ready") -> httpx.Response:
    started = time.monotonic()
    response = client.get(path)
    waited = time.monotonic() - started
    logger.info("%s %d in %.3f s: %s", path, response.status_code, waited, response.text[:300])
    assert waited < READY_BOUND_S + PROBE_SLACK_S, f"{path} took {waited:.2f} s"
    return response


def until(attempt: Callable[[], httpx.Response], done: Callable[[httpx.Response], bool]) -> httpx.Response:
    """``attempt`` again until ``done`` (bounded by ``SETTLE_S``); the last answer."""
    ends = time.monotonic() + SETTLE_S
    while True:
        answer = attempt()
        if done(answer) or time.monotonic() > ends:
            return answer
        time.sleep(0.2)  # the pace of a bounded poll, as a probe's period


def assert_names_the_store(response: httpx.Response, store: HungStore) -> None:
    """A 5xx is strata's problem+json naming the store; a 200 is degraded and its errors name the store."""
    body = response.json()
    assert response.status_code in store.answers, (response.status_code, body)
    if response.status_code >= 500:
        assert response.headers["content-type"].startswith("application/problem+json")
        assert store.named in body["detail"], body["detail"]
    else:
        meta = body["meta"]
        assert meta["status"] == "degraded", meta
        assert any(store.named.lower() in e["message"].lower() for e in meta["errors"]), meta["errors"]


@pytest.mark.parametrize("name", HUNG_STORES)
def test_a_hung_store_costs_a_query_its_deadline_and_the_probe_never_waits(stack: Stack, name: str) -> None:
    client, store = stack.client, stack.stores[name]
    first, _ = ask(client)
    assert first.status_code == 200 and first.json()["meta"]["status"] == "ok", first.json()
    assert probe(client).json()["status"] == "ready"

    store.pause()
    try:
        answers = [ask(client) for _ in range(2)]  # the first meets pooled connections, the next new ones
        for response, took in answers:
            logger.info("%s hung: %d after %.2f s: %s", name, response.status_code, took, response.text[:400])
            assert took < DEADLINE_MS / 1000 + MARGIN_S, f"answered after {took:.2f} s"
            assert_names_the_store(response, store)
        hung = until(lambda: probe(client), lambda r: r.json()["components"][store.component]["status"] == "down")
        assert (hung.status_code, hung.json()["status"]) == (200, "degraded"), hung.json()
        assert hung.json()["components"][store.component]["status"] == "down"
        detail = probe(client, "/ready/detail").json()["components"][store.component]
        assert detail["status"] == "down" and detail["error"], detail
        scraped = client.get("/metrics").text
        assert f'strata_component_down{{component="{store.component}"}} 1.0' in scraped
    finally:
        store.resume()

    back = until(lambda: probe(client), lambda r: r.json()["status"] == "ready")
    assert back.json()["status"] == "ready", back.json()
    again = until(lambda: ask(client)[0], lambda r: r.status_code == 200 and r.json()["meta"]["status"] == "ok")
    assert again.status_code == 200 and again.json()["meta"]["status"] == "ok", again.json()
    assert f'strata_component_down{{component="{store.component}"}} 0.0' in client.get("/metrics").text


# -- strata index ----------------------------------------------------------------------------------------------

INDEX_TIMEOUT_S = 3.0  # the store timeouts of the indexing cell: the setting its error must name
INDEX_SETTINGS = {  # the settings that may bound the first call a run makes to each store after the hang
    "postgresql": ("STRATA_DATABASE__CALL_TIMEOUT_S", "STRATA_DATABASE__CONNECT_TIMEOUT_S"),
    "milvus": ("STRATA_MILVUS__TIMEOUT_S",),
    "redis": (),  # an optional cache: the run goes on without it
}


def names_store_and_setting(text: str, store: HungStore, name: str) -> bool:
    return store.named in text and any(setting in text for setting in INDEX_SETTINGS[name])


INDEX_WITHIN_S = 30.0  # several calls, each cut at INDEX_TIMEOUT_S: far under any store's own wait, never forever


def short_timeouts(settings: Settings) -> Settings:
    """``settings`` with the store timeouts of an indexing run cut to ``INDEX_TIMEOUT_S``."""
    return with_sections(
        settings,
        database={"call_timeout_s": INDEX_TIMEOUT_S, "connect_timeout_s": INDEX_TIMEOUT_S},
        milvus={"timeout_s": INDEX_TIMEOUT_S},
        indexing={"lease_ttl_s": 4 * INDEX_TIMEOUT_S},
    )


def index_outcome(indexer: Indexer, source: Path, kb_id: str) -> tuple[str, float]:
    """The run's failure text ('' when it completed) and how long it took."""
    started = time.monotonic()
    try:
        report = indexer.index_paths([source], kb_id=kb_id)
        failure = "; ".join(f["reason"] for f in report.failures) if report.failed else ""
    except Exception as exc:  # the run's error is what the test asserts on
        failure = f"{type(exc).__name__}: {exc}"
    return failure, time.monotonic() - started


@pytest.mark.parametrize("name", HUNG_STORES)
def test_an_index_run_against_a_hung_store_ends_within_its_timeout_naming_the_store(
    stack: Stack, name: str, memo_encoder: Any
) -> None:
    store, kb_id = stack.stores[name], f"hung_{name}"
    resources = Resources(short_timeouts(stack.settings), encoder=memo_encoder)
    paused: list[str] = []

    def hang_after_the_first_write(step: str) -> None:
        if step == "sql_pending" and not paused:
            paused.append(step)
            store.pause()

    try:
        failure, took = index_outcome(
            Indexer(resources, after_write_step=hang_after_the_first_write), stack.source, kb_id
        )
    finally:
        store.resume()
    logger.info("%s hung during an index run: %.2f s: %s", name, took, failure[:400])
    assert paused and took < INDEX_WITHIN_S, took
    if INDEX_SETTINGS[name]:
        assert names_store_and_setting(failure, store, name), failure
    else:
        assert failure == "", failure
    # a run whose database hung could not release its lease (a SQL call too): it lapses after lease_ttl_s
    lapsed = time.monotonic() + 4 * INDEX_TIMEOUT_S + SETTLE_S
    while True:
        again, _ = index_outcome(Indexer(resources), stack.source, kb_id)
        if not again.startswith("LeaseHeldError") or time.monotonic() > lapsed:
            break
        time.sleep(1.0)  # the pace of a bounded retry while the lease lapses
    resources.close()
    assert again == "", again


# -- an upload ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", HUNG_STORES)
def test_an_upload_to_a_hung_store_is_answered_within_its_timeouts_naming_the_store(
    stack: Stack, name: str, memo_encoder: Any
) -> None:
    store, kb_id = stack.stores[name], f"upload_{name}"
    settings = short_timeouts(stack.settings)
    resources = Resources(settings, encoder=memo_encoder)
    note = (
        "files",
        ("note.md", f"# Note\n\nThe {name} hang note: water tomatoes at dawn.\n".encode(), "text/markdown"),
    )
    with TestClient(create_app(settings, resources=resources, warm_up=False), raise_server_exceptions=False) as client:
        store.pause()
        try:
            started = time.monotonic()
            answer = client.post(f"/kbs/{kb_id}/documents", files=[note])
            took = time.monotonic() - started
        finally:
            store.resume()
        logger.info("%s hung during an upload: %d after %.2f s: %s", name, answer.status_code, took, answer.text[:400])
        assert took < INDEX_WITHIN_S, took
        if INDEX_SETTINGS[name]:
            body = answer.json()
            assert answer.status_code in {200, 503}, body
            text = body["detail"] if answer.status_code == 503 else "; ".join(f["reason"] for f in body["failures"])
            assert names_store_and_setting(text, store, name), text
            if answer.status_code == 503:
                assert answer.headers["content-type"].startswith("application/problem+json")
        else:
            assert answer.status_code == 200 and answer.json()["failed"] == 0, answer.text
    resources.close()
