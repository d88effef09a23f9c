"""``/metrics`` of ``strata serve --workers 2`` is the service's, whichever worker answers the scrape.

Before, each worker answered from its own registry: ``strata_retrievals_total`` read 24, 24, 8, 8, 8 on
consecutive scrapes, and Prometheus saw counters go backwards. Every request here goes on a fresh connection,
so the kernel hands it to either worker; the workers' files in the service's metrics directory say which
workers counted what, so a test knows that both took part before it judges the sums.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from strata.api.metrics import MULTIPROC_DIR, Metrics, multiprocess_dir
from tests.api.shared_service import METRICS, TENANT_A_READ, TENANT_B_READ, SharedService, auth, shared_service
from tests.support.processes import wait_for

Series = tuple[str, tuple[tuple[str, str], ...]]  # sample name and labels
MONOTONIC = {"counter", "histogram"}  # a histogram's buckets, count and sum only grow too (no negative latency)


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str, module_pg_url: str
) -> Iterator[SharedService]:
    with shared_service(
        tmp_path_factory.mktemp("metrics-workers"), milvus_server_uri, module_pg_url, workers=2
    ) as running:
        yield running


def metrics_dir(service: SharedService) -> Path:
    """The private directory ``strata serve`` made for its workers' metrics (it logs where)."""
    found = re.search(r"metrics of 2 workers are kept in (\S+)", service.log_text())
    assert found, service.log_text()[-3000:]
    return Path(found.group(1))


def retrieve(service: SharedService, count: int) -> int:
    """``count`` retrievals, each on a connection of its own; returns ``count``."""
    for n in range(count):
        kb, key = ("alpha", TENANT_A_READ) if n % 2 else ("beta", TENANT_B_READ)
        answer = httpx.post(
            f"{service.url}/retrieve",
            json={"query": f"when is it done? {n}", "top_k": 2, "kb_ids": [kb]},
            headers=auth(key),
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
    return count


def scrape(service: SharedService) -> dict[Series, float]:
    """The monotonic series of one scrape, on a connection of its own."""
    answer = httpx.get(f"{service.url}/metrics", headers=auth(METRICS), timeout=60)
    assert answer.status_code == 200, answer.text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(answer.text)
        if family.type in MONOTONIC
        for sample in family.samples
    }


def retrievals(scraped: dict[Series, float]) -> float:
    return sum(value for (name, _), value in scraped.items() if name == "strata_retrievals_total")


def per_worker(directory: Path, name: str, **labels: str) -> dict[int, float]:
    """``name``'s samples (with ``labels``) added up per worker, from each worker's own counter file."""
    counted: dict[int, float] = {}
    for path in directory.glob("counter_*.db"):
        families = MultiProcessCollector.merge([str(path)])
        samples = [s for f in families for s in f.samples if s.name == name and labels.items() <= s.labels.items()]
        counted[int(path.stem.rsplit("_", 1)[1])] = sum(s.value for s in samples)
    return counted


def assert_monotonic(scrapes: list[dict[Series, float]]) -> None:
    for before, after in itertools.pairwise(scrapes):
        went_back = {
            series: (before[series], after.get(series)) for series in before if after.get(series, -1) < before[series]
        }
        assert not went_back, f"series went backwards (or vanished): {went_back}"


def test_every_scrape_counts_every_workers_retrievals(service: SharedService) -> None:
    directory = metrics_dir(service)
    made = retrieve(service, 8)
    for _ in range(40):  # the kernel picks the worker: go on until both have counted retrievals
        if _workers_that_counted(directory, "strata_retrievals_total") >= 2:
            break
        made += retrieve(service, 2)
    assert _workers_that_counted(directory, "strata_retrievals_total") >= 2, "one worker took every request"
    scrapes = []
    while len(scrapes) < 10 or _scrapes_answered_by(directory) < 2:
        assert len(scrapes) < 60, "one worker answered every scrape"
        if len(scrapes) % 3 == 2:
            made += retrieve(service, 3)
        scrapes.append(scrape(service))
        assert retrievals(scrapes[-1]) == made, f"scrape #{len(scrapes)}: {retrievals(scrapes[-1])} of {made}"
    assert_monotonic(scrapes)


def _workers_that_counted(directory: Path, name: str, **labels: str) -> int:
    return sum(1 for n in per_worker(directory, name, **labels).values() if n)


def _scrapes_answered_by(directory: Path) -> int:
    return _workers_that_counted(directory, "strata_http_requests_total", route="/metrics")


def test_a_worker_that_dies_takes_its_live_gauges_and_leaves_its_counts(service: SharedService) -> None:
    directory = metrics_dir(service)
    retrieve(service, 4)
    before = scrape(service)
    counted = per_worker(directory, "strata_retrievals_total")
    assert retrievals(before) == sum(counted.values()), counted  # every worker's count, in one scrape
    victim = max(counted, key=counted.__getitem__)  # a worker whose retrievals must stay counted
    assert (directory / f"gauge_livesum_{victim}.db").exists()  # its requests-in-progress gauge
    os.kill(victim, signal.SIGKILL)
    assert wait_for(lambda: not (directory / f"gauge_livesum_{victim}.db").exists()), "the dead worker's gauge stayed"
    assert (directory / f"counter_{victim}.db").exists()
    made = retrieve(service, 6)  # served by the worker left and, once it is up, the one that replaced it
    after = [scrape(service) for _ in range(4)]
    assert all(retrievals(s) == retrievals(before) + made for s in after), [retrievals(s) for s in after]
    assert_monotonic([before, *after])


def test_the_private_metrics_directory_leaves_with_the_service(service: SharedService) -> None:
    directory = metrics_dir(service)
    assert directory.is_dir() and oct(directory.stat().st_mode & 0o777) == "0o700"
    service.close()
    assert service.process.returncode == 0, service.log_text()[-3000:]
    assert not directory.exists()


# --- the metrics directory of one run (in-process) ---


def test_several_workers_get_a_private_directory_removed_at_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_DIR, raising=False)
    with multiprocess_dir(workers=2) as path:
        assert path is not None and path.is_dir() and os.environ[MULTIPROC_DIR] == str(path)
        (path / "counter_1.db").write_bytes(b"")
    assert not path.exists() and MULTIPROC_DIR not in os.environ
    with multiprocess_dir(workers=1) as none:  # one process keeps its app's own registry
        assert none is None and MULTIPROC_DIR not in os.environ


def test_the_operators_directory_is_emptied_of_an_earlier_run_and_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(MULTIPROC_DIR, str(tmp_path))
    (tmp_path / "counter_123.db").write_bytes(b"stale")
    (tmp_path / "notes.txt").write_text("the operator's", encoding="utf-8")
    with multiprocess_dir(workers=2) as path:
        assert path == tmp_path and not list(tmp_path.glob("*.db"))
    assert (tmp_path / "notes.txt").exists() and os.environ[MULTIPROC_DIR] == str(tmp_path)


def test_the_hit_ratio_is_undefined_before_the_first_lookup() -> None:
    assert "strata_query_cache_hit_ratio NaN" in Metrics().render().decode()
