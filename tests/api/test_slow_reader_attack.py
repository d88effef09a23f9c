"""Slow readers cannot take ``strata serve --workers 2`` down: issue #50's attack, without a key.

Five thousand sockets, each with a 1 KiB receive buffer, pipeline eight ``GET /openapi.json`` and never read.
Before, a connection whose answer was stuck behind a full send buffer counted as busy forever and one closed to
make room kept its descriptor (``close()`` waits for unsent data): the workers held 3,132 descriptors under a cap
of 1,000 and ``/health`` failed every time. Now each worker's descriptors stay within its cap plus the reserve
the cap is fitted with, and ``/health`` and another tenant's ``/retrieve`` keep answering throughout
(``tests/api/slow_readers.py`` runs the attack; ``WAIT_S``-style bounds only, no timed assertion).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from strata.api.connections import ACCEPT_PASSES, BACKLOG, FD_RESERVE
from tests.api.shared_service import SharedService, shared_service
from tests.api.slow_readers import BURST, HOLD, attack, open_files

pytestmark = [pytest.mark.slow, pytest.mark.cost(60)]

SOCKETS = 5_000
MAX_CONNECTIONS = 500  # per worker: 2 x 500 < 5,000, so both workers shed all the while
HOLD_S = 10.0  # the attack's sockets stay open this long after the last one connected, probes running


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, milvus_server_uri: str, module_pg_url: str
) -> Iterator[SharedService]:
    with shared_service(
        tmp_path_factory.mktemp("slow-readers"),
        milvus_server_uri,
        module_pg_url,
        STRATA_API__MAX_CONNECTIONS=str(MAX_CONNECTIONS),
    ) as running:
        running.http.close()  # its pooled connection would be one more for the workers to hold
        yield running


def test_five_thousand_slow_readers_leave_the_cap_in_force_and_the_service_answering(service: SharedService) -> None:
    with open_files(SOCKETS + 1_000):
        report = attack(service, sockets=SOCKETS, hold_s=HOLD_S)
    budget = MAX_CONNECTIONS + FD_RESERVE + ACCEPT_PASSES * BACKLOG  # what the cap is fitted under the fd limit with
    assert all(peak <= budget for peak in report.peak_fds.values()), (report.peak_fds, budget)
    assert report.sockets == SOCKETS, report
    # while the sockets connect, the workers spend CPU on their first answers: the probes wait their turn, but
    # they are answered (before, every place was held by a connection "busy" for ever and each new one refused)
    assert report.health.answered_ms[BURST] or report.retrieve.answered_ms[BURST], report.health
    # once they are all open and none reads, every probe is answered
    for probe in (report.health, report.retrieve):
        assert probe.answered_ms[HOLD] and not probe.failures[HOLD], probe
    log = service.log_text()
    assert "Traceback" not in log, log[-3000:]
