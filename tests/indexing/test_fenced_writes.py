"""Fenced writes: an indexer paused past its lease cannot write over the run that took the kb.

Run A (older files) stops itself right after a write step (SIGSTOP, as Ctrl-Z or a stalled host would);
its lease runs out by the database's clock; run B indexes newer files and exits 0; A is continued. A must
exit non-zero at its next write with one line naming the lost lease, and B's content must be what serves.
Both runs are ``strata index`` processes on one PostgreSQL database and one Milvus server (a Lite file
cannot be shared by two processes, so the scenario exists only on a server); the kb's first version, which
both update, is indexed in the test process.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from tests.support.documents import write_files
from tests.support.paths import REPO
from tests.support.processes import run_strata, strata_env, wait_for
from tests.support.retrieval import texts
from tests.support.stores import fresh_pg_database, opened, settings_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.milvus_server, pytest.mark.cost(40)]

DOCS = 4


def notes(era: str) -> dict[str, str]:
    return {
        f"note{n}.md": f"# Note {n}\n\nIn the {era} era the lamp of tower {n} burned {era} oil.\n" for n in range(DOCS)
    }


@pytest.fixture
def env(tmp_path: Path, milvus_server_uri: str) -> Iterator[dict[str, str]]:
    with fresh_pg_database() as pg:
        yield strata_env(
            tmp_path / "data",
            STRATA_DATABASE__URL=pg,
            STRATA_MILVUS__URI=milvus_server_uri,
            STRATA_MILVUS__COLLECTION=f"fenced_{uuid.uuid4().hex[:8]}",
            STRATA_INDEXING__LEASE_TTL_S="2",
        )


def stopped(process: subprocess.Popen) -> bool:
    """Whether ``process`` is stopped by a signal (state T in /proc), or gone."""
    try:
        state = Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("T", "t") or process.poll() is not None


def lease_expired(pg_url: str, kb: str) -> bool:
    url = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT expires_at < CURRENT_TIMESTAMP AT TIME ZONE 'UTC' FROM strata_kb_leases WHERE kb_id = %s", (kb,)
        ).fetchone()
    return row is None or bool(row[0])


@pytest.mark.parametrize("step", ["sql_pending:1", "milvus_upsert:1", "activate:1"])
def test_an_indexer_paused_past_its_lease_stops_at_its_next_write_and_the_newer_run_serves(
    env: dict[str, str], tmp_path: Path, step: str, memo_encoder
) -> None:
    docs = write_files(tmp_path / "docs", notes("first"))
    with opened(settings_for(env), memo_encoder) as resources:  # the kb both runs update, indexed here
        assert Indexer(resources).index_paths([docs], kb_id="towers").added == DOCS

    write_files(docs, notes("older"))  # what A reads
    paused = subprocess.Popen(
        [sys.executable, "-m", "tests.kill_at_launcher", step, "index", str(docs), "--kb", "towers"],
        env={**env, "STRATA_TEST_STEP_SIGNAL": "SIGSTOP"},
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: stopped(paused), within_s=180), "run A never reached its step"
        assert paused.poll() is None, paused.communicate()[1][-2000:]
        assert wait_for(lambda: lease_expired(env["STRATA_DATABASE__URL"], "towers"), within_s=60)

        write_files(docs, notes("newer"))  # what B reads
        newer = run_strata(["index", str(docs), "--kb", "towers", "--json"], env)
        assert newer.returncode == 0, newer.stderr
        assert json.loads(newer.stdout)["updated"] == DOCS
    finally:
        paused.send_signal(signal.SIGCONT)
    _, stderr = paused.communicate(timeout=180)

    assert paused.returncode != 0, stderr
    assert "LeaseLostError" in stderr and "lost the indexing lease of knowledge base 'towers'" in stderr, stderr
    settings = settings_for(env)
    with opened(settings, memo_encoder) as resources:
        served = {v.doc_id: v.version for v in resources.documents.versions.of_kb("towers") if v.status == "active"}
        answer = Retriever(resources).retrieve("Which oil did the lamp of tower 1 burn?", 5, kb_ids=["towers"])
    assert len(served) == DOCS
    assert texts(answer) and all("newer" in t and "older" not in t for t in texts(answer)), texts(answer)
    stats = run_strata(["stats", "--kb", "towers", "--json"], env)
    assert stats.returncode == 0 and json.loads(stats.stdout)["consistent"], stats.stdout + stats.stderr
