"""``strata milvus-server``: milvus-lite's own gRPC server, so several strata processes can share one index.

A Milvus Lite file (``.db``) is opened by one process only; the server that
ships in milvus-lite holds its data directory instead and answers any number of
clients on ``http://HOST:PORT``. This command adds nothing to it: it prints the
``STRATA_MILVUS__URI`` to export, then replaces itself with
``python -m milvus_lite server --data-dir DIR --host HOST --port PORT`` (what the
``milvus-lite`` console script runs), so signals and the exit status are the
server's own. Unlike milvus-lite, it binds to loopback unless told otherwise:
the server has no authentication.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import os
import socket
import sys
from pathlib import Path

from strata.cli.serve import is_loopback
from strata.config import ConfigError, Settings


def cmd_milvus_server(args: argparse.Namespace, settings: Settings) -> int:
    if importlib.util.find_spec("milvus_lite") is None:
        raise ConfigError("milvus-lite is not installed in this environment (pip install milvus-lite)")
    if port_taken(args.host, args.port):  # milvus-lite would bind beside it (SO_REUSEPORT) and get half the clients
        raise ConfigError(
            f"port {args.port} on {args.host} is already in use: a second server there would share it and answer "
            "some clients from another data directory; stop the other one or choose another --port"
        )
    command = server_command(args.data_dir, host=args.host, port=args.port)
    print(f"export STRATA_MILVUS__URI={client_uri(args.host, args.port)}", flush=True)
    if not is_loopback(args.host):
        print(
            f"strata milvus-server: {args.host} is reachable from other hosts and the server has no authentication",
            file=sys.stderr,
            flush=True,
        )
    os.execv(sys.executable, command)
    return 0  # not reached: execv replaces the process


def server_command(data_dir: Path, *, host: str, port: int) -> list[str]:
    """The milvus-lite server this command becomes, run by this environment's Python."""
    return [
        sys.executable,
        "-m",
        "milvus_lite",
        "server",
        "--data-dir",
        str(data_dir),
        "--host",
        host,
        "--port",
        str(port),
    ]


def port_taken(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` already. milvus-lite's gRPC server sets ``SO_REUSEPORT``, so a
    second one binds the same port without an error and the kernel splits new connections between the two."""
    family, kind, proto, _, address = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is no server
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def client_uri(host: str, port: int) -> str:
    """What a strata process on this host connects to (a wildcard bind is reached on loopback)."""
    address = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in address:
        address = f"[{address}]"
    return f"http://{address}:{port}"
