"""``strata index --server URL``: send the files to a running service instead of opening the stores.

Same report, ``--json`` keys and exit codes as local indexing. File names
are sent relative to the folder given (a file given by itself: its name), so
documents get the ids a local ``strata index`` would give them. Each folder
argument is one upload naming its root, so ``--delete-missing`` deletes what
the local command deletes; entries that cannot be read (a FIFO, a dangling
symlink) are failures or skipped, as locally, and their indexed versions are
kept. A folder of any size is one upload in several requests
(``StrataClient.index_files``, ``strata.upload_batches``): only the last one
deletes, from the complete list of the folder's files.

A root is an identity, not the path as typed: this host's name and the
folder's absolute path (``docs`` typed in ``/home/alice`` and ``/home/bob``
are two roots; ``docs`` and ``/home/alice/docs`` one), or ``--root-id``
where several hosts or checkouts send one folder. A ``--root-id`` naming the
absolute path a local ``strata index`` recorded as the root of the kb's
documents continues that kb through the service (``api.uploads.root_name``). Two folders can never
share a root by their names alone, so ``--delete-missing`` from one never
deletes another's documents.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.cli.index_report import print_report
from strata.client import StrataClient
from strata.config import Settings
from strata.errors import NotFoundError
from strata.indexing.loaders import is_supported, unreadable_reason, walk_folder
from strata.indexing.report import IndexReport

KEPT = " (its indexed version, if any, is kept)"


@dataclass
class Upload:
    """One root's files: ``(name sent, local path)``, the root named, and what deletion may touch."""

    root: str
    files: list[tuple[str, Path]] = field(default_factory=list)
    keep: list[str] = field(default_factory=list)
    scopes_deletion: bool = True


@dataclass
class Collected:
    uploads: list[Upload] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    complete: bool = True  # every argument existed and was read whole (else nothing is deleted, as locally)


def cmd_remote_index(args: argparse.Namespace, settings: Settings, *, url: str, api_key: str | None) -> int:
    collected = collect_files(args.paths, root_id=getattr(args, "root_id", None))
    reports: list[dict[str, Any]] = []
    if args.delete_missing and (empty := [u.root for u in collected.uploads if not u.files and u.scopes_deletion]):
        print(
            f"strata index: the folder {empty[0]} holds no file to index: nothing of it was sent, and an empty folder "
            "deletes nothing, even with --force (check it: a sync or mount gone wrong?)",
            file=sys.stderr,
        )
        return 1
    with StrataClient(url, api_key) as client:
        for n, upload in enumerate(u for u in collected.uploads if u.files):
            try:
                report = client.index_files(
                    args.kb,
                    upload.files,
                    delete_missing=args.delete_missing and upload.scopes_deletion and collected.complete,
                    recreate=args.recreate and n == 0,
                    dry_run=args.dry_run,
                    timeout=settings.server.timeout_s,
                    root=upload.root,
                    keep=upload.keep,
                    max_delete=args.max_delete,
                    force=args.force,
                )
            except (ValueError, NotFoundError) as exc:
                print(f"strata: the service refused the files: {exc}", file=sys.stderr)
                return 1
            reports.append(with_local_paths(report, upload.files))
    report = with_local_entries(merged(reports, kb=args.kb, dry_run=args.dry_run), collected)
    print_report(report, as_json=args.json)
    return 1 if report["failed"] else 0


def collect_files(paths: Sequence[Path], *, root_id: str | None = None) -> Collected:
    """What each path argument sends, and the entries reported here (as ``strata.indexing.scan`` reports them).

    ``root_id`` names the root of every folder argument instead of this host and the folder's absolute path.
    """
    collected = Collected()
    by_parent: dict[str, Upload] = {}
    for path in paths:
        if path.is_dir():
            collected.uploads.append(_folder(path, collected, root_id))
        elif not os.path.lexists(path):
            collected.failures.append(
                {"source": str(path), "reason": "no such file or directory (nothing under it was deleted)"}
            )
            collected.complete = False
        else:
            root = _root(path.parent)
            upload = by_parent.setdefault(root, Upload(root, scopes_deletion=False))
            _entry(path, path.name, upload, collected)
    collected.uploads.extend(by_parent.values())
    return collected


def _folder(path: Path, collected: Collected, root_id: str | None) -> Upload:
    upload = Upload(f"id:{root_id}" if root_id else _root(path))
    walk = walk_folder(path)
    collected.failures.extend({"source": str(path), "reason": error} for error in walk.errors)
    collected.complete &= not walk.errors
    for entry, reason in walk.unreadable:
        _unreadable(entry, entry.relative_to(path).as_posix(), reason, upload, collected)
    collected.skipped.extend({"source": str(entry), "reason": reason} for entry, reason in walk.skipped)
    upload.keep.extend(entry.relative_to(path).as_posix() for entry, _ in walk.skipped)  # not read: kept, as locally
    upload.files.extend((f.relative_to(path).as_posix(), f) for f in walk.files)
    return upload


def _entry(path: Path, name: str, upload: Upload, collected: Collected) -> None:
    reason = unreadable_reason(path)
    if reason is None:
        upload.files.append((name, path))
    else:
        _unreadable(path, name, reason, upload, collected)


def _unreadable(path: Path, name: str, reason: str, upload: Upload, collected: Collected) -> None:
    upload.keep.append(name)  # also a skipped one: it may be a folder that is not there now (an unmounted share)
    if not is_supported(path):
        collected.skipped.append({"source": str(path), "reason": reason})
        return
    collected.failures.append({"source": str(path), "reason": reason + KEPT})


def _root(folder: Path) -> str:
    """The folder as the root an upload names: this host and the folder's absolute path (``host:/abs/docs``).

    ``abspath``, not ``resolve()``: a folder reached through a symlink is the root its user named, as locally.
    """
    return f"{socket.gethostname()}:{Path(os.path.abspath(folder)).as_posix()}"


def merged(reports: Sequence[dict[str, Any]], *, kb: str, dry_run: bool) -> dict[str, Any]:
    """One report of several uploads: counts and seconds added, lists joined."""
    total: dict[str, Any] = IndexReport(kb=kb, dry_run=dry_run).to_dict()
    for report in reports:
        for key, value in report.items():
            if isinstance(value, list) or (isinstance(value, (int, float)) and not isinstance(value, bool)):
                total[key] = total.get(key, type(value)()) + value
    seconds = total.get("seconds", 0)
    total["chunks_per_s"] = round(total.get("chunks_written", 0) / seconds, 2) if seconds else 0.0
    return total


def with_local_paths(report: dict[str, Any], files: Sequence[tuple[str, Path]]) -> dict[str, Any]:
    """Failures, skipped files and warnings named by their local paths, as a local run names them."""
    local = {name: str(path) for name, path in files}

    def renamed(entries: list[dict[str, str]]) -> list[dict[str, str]]:
        return [{**e, "source": local.get(e["source"], e["source"])} for e in entries]

    named = ("failures", "skipped", "warnings")
    return {**report, **{key: renamed(report.get(key, [])) for key in named}}  # an older service sends no warnings


def with_local_entries(report: dict[str, Any], collected: Collected) -> dict[str, Any]:
    """The report with the entries found here that were never sent."""
    return {
        **report,
        "failed": report["failed"] + len(collected.failures),
        "failures": [*collected.failures, *report["failures"]],
        "skipped": [*collected.skipped, *report["skipped"]],
    }
