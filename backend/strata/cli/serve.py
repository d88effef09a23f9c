"""``strata serve``: the HTTP service under uvicorn.

Refuses what cannot work or is unsafe, with one line each: several workers
on a Milvus Lite file (one process owns it), a non-loopback address without
API keys unless ``--insecure``, and a local model folder that is missing,
unreadable or does not load (``model folder /models/bge-m3: not found``).
SIGTERM stops uploads at once, at their next batch boundary (a parse in progress
killed; a 503 with Retry-After; the pending version kept for the next upload to
continue) and lets other requests in flight finish for
``STRATA_API__SHUTDOWN_GRACE_S``; then the ones still running are cancelled (their
uploads' temporary folders removed), indexing runs unwound (the kb's lease
released), and the process exits 0, or 1 once ``supervisor.EXIT_BUDGET_S`` past
the grace (``strata.cli.supervisor``). With several workers, ``/metrics`` adds
up every worker's values, whichever answers (``strata.api.metrics``).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from strata.config import Settings
from strata.encoders.model_folder import check_encoder_loads, check_model_folder
from strata.logs import fatal
from strata.stores.schema_version import open_database_schema
from strata.tracing import check_tracing

if TYPE_CHECKING:
    import uvicorn

    from strata.api.auth import KeyRing
    from strata.resources import Resources

logger = logging.getLogger("strata")
WORKER_HEALTHCHECK_S = 30  # how long a worker may take to answer the supervisor's ping (uvicorn: 5)


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from strata.api.auth import KeyRing
    from strata.api.metrics import multiprocess_dir
    from strata.api.shared_slots import shared_slots_dir

    host = args.host or settings.api.host
    port = args.port or settings.api.port
    keys = KeyRing.from_settings(settings.api)  # a key that could never match is a ConfigError here
    keyed = keys.enabled
    refusal = serve_refusal(settings, host=host, workers=args.workers, keyed=keyed, insecure=args.insecure)
    if refusal:
        fatal(f"strata serve: {refusal}")
        return 2
    check_tracing(settings)  # tracing asked for without the otel extra stops it here, in one line
    check_model_folder(settings.embedding)  # an empty or unreadable model volume stops it here, in one line
    open_database_schema(settings.database)  # a PostgreSQL database behind `strata db upgrade` stops it here
    resources = _loaded_resources(settings) if args.workers == 1 else None
    if not keyed:
        logger.warning("no API keys configured (STRATA_API__KEYS): serving %s:%d without authentication", host, port)
    try:
        # set before any worker creates a metric or takes a slot; the private folders are removed at exit
        with multiprocess_dir(args.workers), shared_slots_dir(args.workers):
            _run(
                settings,
                host=host,
                port=port,
                workers=args.workers,
                keys=keys,
                resources=resources,
                verbose=bool(getattr(args, "verbose", False)),
            )
    finally:
        if resources is not None:
            resources.close()
    return 0


def _loaded_resources(settings: Settings) -> Resources:
    """The engine parts with the encoder loaded, before serving: a model that cannot load stops the start."""
    from strata.resources import Resources

    resources = Resources(settings)
    try:
        check_encoder_loads(resources.encoder, settings.embedding)
    except BaseException:
        resources.close()
        raise
    return resources


def serve_refusal(settings: Settings, *, host: str, workers: int, keyed: bool, insecure: bool) -> str | None:
    """Why the service must not start this way, or None."""
    if workers < 1:
        return "--workers must be at least 1"
    if workers > 1 and settings.milvus.is_lite:
        return (
            f"--workers {workers} needs a Milvus server: the Milvus Lite file {settings.milvus.uri} "
            "can be opened by one process only (use --workers 1 or set STRATA_MILVUS__URI=http://host:19530)"
        )
    if not keyed and not insecure and not is_loopback(host):
        return (
            f"refusing to serve {host} without API keys: set STRATA_API__KEYS (or STRATA_API__KEYS_FILE), "
            "bind to 127.0.0.1, or pass --insecure"
        )
    return None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _run(
    settings: Settings,
    *,
    host: str,
    port: int,
    workers: int,
    keys: KeyRing,
    resources: Resources | None,
    verbose: bool = False,
) -> None:
    from strata.api.connections import ConnectionLimits, ServeConfig, raise_open_file_limit
    from strata.logs import LogSetup

    # uvicorn re-raises the signal that stopped it once it has drained; a handler of our own
    # receives it instead of the default action, so a SIGTERM shutdown exits 0.
    signal.signal(signal.SIGTERM, lambda *_: logger.info("stopped by SIGTERM"))
    limits = ConnectionLimits.for_process(settings.api, raise_open_file_limit())  # workers inherit the raised limit
    logger.info(
        "at most %d connections per process; headers within %g s; answers read within %g s; keep-alive %g s; "
        "%d pipelined requests",
        limits.max_connections,
        limits.header_timeout_s,
        limits.write_timeout_s,
        limits.keep_alive_s,
        limits.max_pipelined_requests,
    )
    grace = settings.api.shutdown_grace_s
    common: dict[str, Any] = {
        "host": host,
        "port": port,
        "access_log": False,
        "timeout_graceful_shutdown": grace,
        "log_setup": LogSetup.of(settings, verbose=verbose),  # each worker configures its logging from it
    }
    if workers == 1:
        from strata.api import create_app

        _serve_one(ServeConfig(create_app(settings, resources=resources, keys=keys), limits=limits, **common))
    else:  # each worker builds its app from the environment
        from strata.cli.supervisor import WorkerSupervisor

        # The supervisor pings each worker through a pipe its thread answers; a worker in one long C call that
        # keeps the interpreter lock (a large JSON body, a big encode) misses uvicorn's 5 s and is killed mid-request.
        config = ServeConfig(
            "strata.api.app:app_from_environment",
            limits=limits,
            factory=True,
            workers=workers,
            timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
            **common,
        )
        WorkerSupervisor(config, sockets=[_tcp_listener(config)]).run()  # what uvicorn.run does, with this socket


def _serve_one(config: uvicorn.Config) -> None:
    """What ``uvicorn.run`` does for one process, with a config of strata's own."""
    from uvicorn.config import STARTUP_FAILURE

    from strata.cli.supervisor import StrataServer

    server = StrataServer(config)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    if not server.started:
        sys.exit(STARTUP_FAILURE)


def _tcp_listener(config: uvicorn.Config) -> socket.socket:
    """The workers' listening socket, declared TCP so that their connections get TCP_NODELAY.

    uvicorn (0.54) binds it with proto 0; the workers' connections inherit that, and asyncio turns Nagle's
    algorithm off only on sockets whose proto is IPPROTO_TCP. With Nagle on, every response after the first
    on a keep-alive connection waited ~40 ms for the client's delayed ACK: one caller's p50 on --workers 2
    was 84 ms against 43 ms on --workers 1 (uvicorn issue #3149).
    """
    sock = config.bind_socket()
    if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.proto != socket.IPPROTO_TCP:
        sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
    return sock
