"""The ``strata`` command: index, delete, stats, reconcile, query, eval, serve, rebuild, milvus-server, db.

Each sub-command lives in a module of this package, imported only when run.
"""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from strata.config import ConfigError, Settings, get_settings
from strata.errors import StrataError
from strata.evaluation.modes import DEFAULT_MODES, MODES
from strata.logs import fatal
from strata.strategy_table import DEFAULT_STRATEGY, STRATEGY_NAMES

logger = logging.getLogger("strata")


def configure_logging(settings: Settings, *, verbose: bool = False) -> None:
    """Entry-point logging (``strata.logs``): strata at the configured level, libraries at WARNING."""
    from strata.logs import LogSetup, configure

    configure(LogSetup.of(settings, verbose=verbose))


def add_index_options(p: argparse.ArgumentParser) -> None:
    """The options of ``strata index`` after its paths (shared with ``scripts/build_index.py``)."""
    p.add_argument("--kb", required=True, help="knowledge base id")
    p.add_argument("--delete-missing", action="store_true", help="delete documents whose files are gone")
    p.add_argument("--recreate", action="store_true", help="drop the knowledge base and rebuild it")
    p.add_argument("--batch-size", type=int, help="passages per encoder call (STRATA_EMBEDDING__BATCH_SIZE)")
    p.add_argument("--dry-run", action="store_true", help="report what would change, write nothing")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _add_index(sub: Any) -> None:
    p = sub.add_parser("index", help="index files/folders into a knowledge base (incremental)")
    p.add_argument("paths", nargs="+", type=Path)
    add_index_options(p)
    p.add_argument("--server", metavar="URL", help="send the files to a running `strata serve` (STRATA_SERVER__URL)")
    p.add_argument("--api-key", metavar="KEY", help="bearer key for --server (STRATA_SERVER__API_KEY)")
    p.add_argument(
        "--max-delete",
        type=int,
        metavar="N",
        help="--delete-missing deletes at most N documents, else nothing (STRATA_INDEXING__MAX_DELETE, default 100)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="--delete-missing may delete over --max-delete or half of the folders' "
        "documents (an empty folder still deletes nothing)",
    )
    p.add_argument(
        "--root-id",
        metavar="ID",
        help="with --server: the folders' root identity, instead of this host's name and "
        "the folder's absolute path (--delete-missing deletes only documents of this root)",
    )
    p.set_defaults(handler=_lazy("strata.cli.index", "cmd_index"))


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the HTTP service (retrieval, knowledge bases, uploads)")
    p.add_argument("--host", help="address to bind (STRATA_API__HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (STRATA_API__PORT, default 8080)")
    p.add_argument("--workers", type=int, default=1, help="worker processes (more than 1 needs a Milvus server)")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback address without API keys")
    p.set_defaults(handler=_lazy("strata.cli.serve", "cmd_serve"))


def _add_maintenance(sub: Any) -> None:
    p = sub.add_parser("delete", help="delete a document from a knowledge base")
    p.add_argument("doc_id", nargs="?")
    p.add_argument("--source", help="the document's source path instead of its id")
    p.add_argument("--kb", required=True)
    p.set_defaults(handler=_lazy("strata.cli.index", "cmd_delete"))
    p = sub.add_parser("stats", help="counts per store, to check that they agree")
    p.add_argument("--kb", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("strata.cli.index", "cmd_stats"))
    p = sub.add_parser("reconcile", help="compare Milvus and the cache with SQL; --repair makes them agree")
    p.add_argument("--kb", required=True)
    p.add_argument("--repair", action="store_true", help="fix what differs (without it: report only)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_lazy("strata.cli.index", "cmd_reconcile"))


def _add_query(sub: Any) -> None:
    p = sub.add_parser("query", help="retrieve evidence for a query")
    p.add_argument("query")
    p.add_argument("--kb", action="append", help="knowledge base id (repeat for several; default all)")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--module", action="append", default=[], help="filter: front-matter module")
    p.add_argument("--skill-point", action="append", default=[], help="filter: skill point")
    p.add_argument("--source-prefix", help="filter: source path prefix")
    p.add_argument("--json", action="store_true", help="print the RetrievalResult as JSON")
    p.add_argument("--explain", action="store_true", help="print stages, merges and per-doc traces")
    p.add_argument(
        "--strategy",
        choices=STRATEGY_NAMES,
        help=f"retrieval strategy (default STRATA_RETRIEVAL__STRATEGY, {DEFAULT_STRATEGY})",
    )
    p.add_argument("--query-variant", action="append", default=[], help="fusion: another phrasing to search (repeat)")
    p.set_defaults(handler=_lazy("strata.cli.query", "cmd_query"))


def _add_eval(sub: Any) -> None:
    p = sub.add_parser("eval", help="evaluate retrieval on a SQuAD-style data set (docs/evaluation.md)")
    p.add_argument("dataset", type=Path)
    p.add_argument("--sample", type=int, help="questions to sample (seed 13); default all")
    p.add_argument("--k", default="5,10", help="comma-separated k values (default 5,10)")
    p.add_argument(
        "--modes",
        help=f"comma-separated, of {', '.join(MODES)} (docs/evaluation.md); default {','.join(DEFAULT_MODES)}",
    )
    p.add_argument("--out", type=Path, default=Path("eval-out"))
    p.add_argument("--kb", default="eval", help="knowledge base id for the corpus")
    p.add_argument("--reuse-index", action="store_true", help="skip indexing when the kb is already built")
    p.set_defaults(handler=_lazy("strata.cli.evaluate", "cmd_eval"))


def _add_rebuild(sub: Any) -> None:
    p = sub.add_parser(
        "rebuild",
        help="write a kb's Milvus leaves again from SQL (in place, or into another Milvus with --to-uri)",
        description="Rebuilds a knowledge base's leaves in Milvus from SQL, the source of truth: vectors come from "
        "the SQL embedding cache (only what it lacks is encoded), the result is flushed and verified against SQL. "
        "Without --to-uri it rebuilds IN PLACE: the kb's leaves are deleted first, so queries of the kb find "
        "nothing until it finishes. With --to-uri the configured Milvus is not touched; point "
        "STRATA_MILVUS__URI at the verified copy afterwards.",
    )
    p.add_argument("--kb", required=True, help="knowledge base id")
    p.add_argument(
        "--to-uri", metavar="URI", help="write a copy into this Milvus: a Lite file *.db or http://host:19530"
    )
    p.add_argument("--collection", metavar="NAME", help="collection of the copy (default STRATA_MILVUS__COLLECTION)")
    p.add_argument(
        "--isolation",
        choices=["collection", "partition", "partition_key"],
        help="the copy's isolation level (docs/deploy.md; default STRATA_MILVUS__ISOLATION): with --to-uri or "
        "--collection, to move kbs between levels",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(handler=_lazy("strata.cli.rebuild", "cmd_rebuild"))


def _add_milvus_server(sub: Any) -> None:
    p = sub.add_parser(
        "milvus-server",
        help="run milvus-lite's gRPC server, so several strata processes share one index",
        description="Runs `milvus-lite server` (nothing more) after printing the STRATA_MILVUS__URI to export; "
        "strata serve --workers N, strata index and strata query can then run at the same time.",
    )
    p.add_argument("--data-dir", type=Path, required=True, help="the server's data directory (created if missing)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; the server has no auth)")
    p.add_argument("--port", type=int, default=19530, help="port (default 19530)")
    p.set_defaults(handler=_lazy("strata.cli.milvus_server", "cmd_milvus_server"))


def _add_milvus_user(sub: Any) -> None:
    p = sub.add_parser("milvus-user", help="make the Milvus user strata runs as, with only the privileges it uses")
    users = p.add_subparsers(dest="milvus_user_command", required=True)
    create = users.add_parser(
        "create",
        help="the role and the user of STRATA_MILVUS__TOKEN, as the administrator of MILVUS_ADMIN_TOKEN",
        description="Creates the role (collection reads and writes, creating and dropping collections, in the "
        "default database), then the user of STRATA_MILVUS__TOKEN (user:password) holding it, logged in with "
        "MILVUS_ADMIN_TOKEN (root:<password>). Safe to run twice; an existing user's password is kept.",
    )
    create.add_argument("--role", default="strata_rw", help="the role's name (default strata_rw)")
    create.set_defaults(handler=_lazy("strata.cli.milvus_user", "cmd_milvus_user_create"))


def _add_db(sub: Any) -> None:
    p = sub.add_parser("db", help="the SQL schema: upgrade, downgrade, wait for or show its version; copy a database")
    db = p.add_subparsers(dest="db_command", required=True)
    db.add_parser(
        "upgrade", help="migrate the database to the schema this strata needs (safe to run twice)"
    ).set_defaults(handler=_lazy("strata.cli.db", "cmd_db_upgrade"))
    db.add_parser("current", help="print the schema version; exit 1 when this strata cannot run on it").set_defaults(
        handler=_lazy("strata.cli.db", "cmd_db_current")
    )
    down = db.add_parser("downgrade", help="take the schema back (default: one step); lossy steps need --force")
    down.add_argument("revision", nargs="?", help="the revision to go back to (default: the one before the current)")
    down.add_argument("--force", action="store_true", help="also undo steps whose downgrade loses rows")
    down.set_defaults(handler=_lazy("strata.cli.db", "cmd_db_downgrade"))
    wait = db.add_parser("wait", help="block until the schema is one this strata runs on (an init container)")
    wait.add_argument("--timeout", type=float, default=600.0, help="give up (exit 1) after this many seconds (600)")
    wait.add_argument("--interval", type=float, default=2.0, help="seconds between checks (2)")
    wait.set_defaults(handler=_lazy("strata.cli.db", "cmd_db_wait"))
    copy = db.add_parser("copy", help="copy the strata rows of another database (SQLite) into the configured one")
    copy.add_argument(
        "--from", dest="source", required=True, metavar="URL", help="the source, e.g. sqlite:///data/strata.sqlite3"
    )
    copy.set_defaults(handler=_lazy("strata.cli.db", "cmd_db_copy"))


def _lazy(module: str, name: str) -> Callable[[argparse.Namespace, Settings], int]:
    def run(args: argparse.Namespace, settings: Settings) -> int:
        import importlib

        return getattr(importlib.import_module(module), name)(args, settings)

    return run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="strata", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_index,
        _add_maintenance,
        _add_query,
        _add_eval,
        _add_serve,
        _add_rebuild,
        _add_milvus_server,
        _add_milvus_user,
        _add_db,
    ):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from strata.encoders import tune_openmp  # here, not at import: --help needs no numpy

    tune_openmp()  # before any encoder's libgomp loads (a library caller opts in itself)
    try:
        settings = get_settings()
        configure_logging(settings, verbose=args.verbose)
        return int(args.handler(args, settings))
    except ConfigError as exc:
        fatal(f"strata: configuration error: {exc}")
        return 2
    except ValueError as exc:  # a bad argument the parser could not see (an empty query, top_k out of range)
        fatal(f"strata {args.command}: error: {exc}")
        return 2
    except StrataError as exc:
        fatal(f"strata: {type(exc).__name__}: {exc}")
        return 1
    except KeyboardInterrupt:
        fatal("strata: interrupted")
        return 130
    except BrokenPipeError:
        if not _stdout_is_a_pipe():
            raise
        # The reader of the output left (``strata query ... | head``): no traceback, and nothing more written
        # at exit (Python flushes stdout then, and would fail again).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a command that SIGPIPE ended: 128 + 13


def _stdout_is_a_pipe() -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(sys.stdout.fileno()).st_mode)
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
