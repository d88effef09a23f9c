"""``strata index --server URL``: send the files to a running service instead of opening the stores.

Same report, ``--json`` keys and exit codes as local indexing. File names
are sent relative to the folder given (a file given by itself: its name), so
documents get the ids a local ``strata index`` would give them.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from strata.cli.index import _print_report as print_report  # the local command's printer, shared
from strata.client import StrataClient
from strata.config import Settings
from strata.errors import LoaderError, NotFoundError
from strata.indexing.loaders import iter_source_files
from strata.indexing.report import IndexReport


def cmd_remote_index(args: argparse.Namespace, settings: Settings, *, url: str, api_key: str | None) -> int:
    files, missing = collect_files(args.paths)
    if not files:
        report = IndexReport(kb=args.kb, dry_run=args.dry_run).to_dict()
        print_report(with_local_failures(report, missing), as_json=args.json)
        return 1 if missing else 0
    with StrataClient(url, api_key) as client:
        try:
            report = client.index_files(
                args.kb, files, delete_missing=args.delete_missing, recreate=args.recreate, dry_run=args.dry_run,
                timeout=settings.server.timeout_s,
            )  # fmt: skip
        except (ValueError, NotFoundError) as exc:
            print(f"strata: the service refused the files: {exc}", file=sys.stderr)
            return 1
    report = with_local_failures(with_local_paths(report, files), missing)
    print_report(report, as_json=args.json)
    return 1 if report["failed"] else 0


def collect_files(paths: Sequence[Path]) -> tuple[list[tuple[str, Path]], list[dict[str, str]]]:
    """``(name sent, local path)`` of every file under ``paths``, and the paths that do not exist."""
    files: list[tuple[str, Path]] = []
    missing: list[dict[str, str]] = []
    for path in paths:
        root = path if path.is_dir() else path.parent
        try:
            found = iter_source_files([path])
        except LoaderError as exc:
            missing.append({"source": str(path), "reason": str(exc)})
            continue
        files += [(f.relative_to(root).as_posix(), f) for f in found]
    return files, missing


def with_local_paths(report: dict[str, Any], files: Sequence[tuple[str, Path]]) -> dict[str, Any]:
    """Failures and skipped files named by their local paths, as a local run names them."""
    local = {name: str(path) for name, path in files}

    def renamed(entries: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{**e, "source": local.get(e["source"], e["source"])} for e in entries]

    return {**report, "failures": renamed(report["failures"]), "skipped": renamed(report["skipped"])}


def with_local_failures(report: dict[str, Any], missing: list[dict[str, str]]) -> dict[str, Any]:
    if not missing:
        return report
    return {**report, "failed": report["failed"] + len(missing), "failures": [*missing, *report["failures"]]}
