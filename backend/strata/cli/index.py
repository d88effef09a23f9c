"""``strata index``, ``delete``, ``stats`` and ``reconcile``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path, PurePosixPath
from typing import Any

from strata.cli.index_report import print_report
from strata.cli.progress import make_progress
from strata.config import ConfigError, Settings, with_overrides
from strata.errors import NotFoundError
from strata.indexing.consistency import kb_stats
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from strata.stores.leaf_index import LeafIndex


def cmd_index(args: argparse.Namespace, settings: Settings) -> int:
    server_url = getattr(args, "server", None) or settings.server.url
    if server_url:  # a running `strata serve` owns the stores: send it the files
        from strata.cli.remote_index import cmd_remote_index

        api_key = getattr(args, "api_key", None) or settings.server.api_key.get_secret_value() or None
        return cmd_remote_index(args, settings, url=server_url, api_key=api_key)
    if getattr(args, "root_id", None):
        print("strata index: --root-id names the root of an upload: use it with --server", file=sys.stderr)
        return 2
    if args.batch_size is not None:
        settings = with_overrides(settings, {"embedding": {"batch_size": args.batch_size}})
    resources = Resources(settings)
    progress = make_progress(enabled=not args.json)
    try:
        report = Indexer(resources).index_paths(
            args.paths,
            kb_id=args.kb,
            delete_missing=args.delete_missing,
            recreate=args.recreate,
            dry_run=args.dry_run,
            progress=progress,
            max_delete=args.max_delete,
            force_delete=args.force,
        )
    finally:
        progress.close()
    print_report(report.to_dict(), as_json=args.json)
    return 1 if report.failed else 0


def cmd_delete(args: argparse.Namespace, settings: Settings) -> int:
    if bool(args.doc_id) == bool(args.source):
        raise ConfigError("give either a DOC_ID or --source PATH")
    resources = Resources(settings)
    doc_id = args.doc_id or _doc_id_for_source(resources, args.kb, args.source)
    if doc_id is None or not Indexer(resources).delete_document(args.kb, doc_id):
        print(f"no document {args.doc_id or args.source!r} in kb {args.kb}", file=sys.stderr)
        return 1
    print(f"deleted {doc_id} from kb {args.kb}")
    return 0


def _doc_id_for_source(resources: Any, kb_id: str, source: str) -> str | None:
    """The document whose stored source (relative to the indexed folder) ends ``source``; the longest match wins."""
    wanted = Path(source).parts
    matches = [
        (len(parts), version.doc_id)
        for version in resources.documents.versions.of_kb(kb_id)
        if (parts := PurePosixPath(version.source).parts) and wanted[-len(parts) :] == parts
    ]
    return max(matches)[1] if matches else None


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """Counts, and a probe of every served version's first and last leaf in Milvus by id; no chunk row, no
    vector and no model is loaded. Exit 1 naming the difference when Milvus does not hold what SQL serves."""
    resources = Resources(settings)
    kb = resources.documents.kbs.get_kb(args.kb)
    if kb is None:
        print(f"no knowledge base {args.kb!r}", file=sys.stderr)
        return 1
    # The collection is opened as the kb's encoder built it: its name and dimension are recorded, so the
    # encoder model (BGE-M3: seconds and gigabytes) is not loaded to learn them.
    index = LeafIndex(settings.milvus, encoder_name=kb.encoder, dim=kb.dim)
    try:
        stats = kb_stats(resources.documents.versions, index, kb)
    finally:
        index.close()
    if args.json:
        print(json.dumps(stats.to_dict(), ensure_ascii=False, indent=2))
    else:
        levels = stats.chunks_by_level
        print(
            f"kb {args.kb}: {stats.documents} documents; chunks L1 {levels['1']}, L2 {levels['2']}, "
            f"L3 {levels['3']}; Milvus leaves {stats.leaves_in_milvus} "
            f"({'consistent' if stats.consistent else 'MISMATCH'}); "
            f"encoder {kb.encoder} (dim {kb.dim})"
        )
        if stats.difference:
            print(f"  {stats.difference}; `strata reconcile --kb {args.kb}` lists every difference")
    return 0 if stats.consistent else 1


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    """Reports what differs between the stores (exit 1 when something does); ``--repair`` fixes it."""
    resources = Resources(settings)
    _known_kb(resources, args.kb)
    report = Indexer(resources).reconcile(args.kb, repair=args.repair).to_dict()
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        cache = "unknown" if report["stale_cache"] is None else report["stale_cache"]
        print(
            f"kb {args.kb}: {report['leftover_versions']} unfinished or retired versions, "
            f"{report['missing_in_milvus']} leaves missing in Milvus, {report['orphans_in_milvus']} orphan leaves "
            f"in Milvus, {cache} stale cache entries, {report['invalidations_pending']} failed cache invalidations "
            f"recorded, {report['versions_without_term_stats']} versions without term statistics; "
            f"{report['unused_embeddings']} cached vectors no served leaf uses"
            + (
                " (deleted)"
                if report["repaired"]
                else " (--repair deletes them)"
                if report["unused_embeddings"]
                else ""
            )
            + (" - repaired" if report["repaired"] else "")
        )
        for note in report["notes"]:
            print(f"  note: {note}")
        if report["differences"] and not report["repaired"]:
            print("  run again with --repair to fix them")
    return 0 if report["repaired"] or not report["differences"] else 1


def _known_kb(resources: Resources, kb_id: str) -> None:
    """Raises ``NotFoundError`` (one line, naming the kbs there are) for a kb SQL does not know."""
    if resources.documents.kbs.get_kb(kb_id) is None:
        known = sorted(kb.kb_id for kb in resources.documents.kbs.list_kbs())
        raise NotFoundError(f"no knowledge base {kb_id!r}; known: {', '.join(known) if known else 'none'}")
