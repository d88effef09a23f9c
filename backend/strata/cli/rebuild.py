"""``strata rebuild``: a knowledge base's Milvus leaves written again from SQL, in place or into another Milvus."""

from __future__ import annotations

import argparse
import json
import logging
import os

from pydantic import ValidationError

from strata.cli.progress import make_progress
from strata.config import ConfigError, MilvusSettings, Settings, describe_validation_error
from strata.indexing.rebuild import Rebuilder
from strata.resources import Resources


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    # pymilvus configures its own loggers when first imported, after the entry point silenced them;
    # its query iterator would warn on every Milvus Lite read-back.
    logging.getLogger("pymilvus").setLevel(logging.CRITICAL)
    target = target_settings(settings.milvus, to_uri=args.to_uri, collection=args.collection, isolation=args.isolation)
    resources = Resources(settings)
    progress = make_progress(enabled=not args.json)
    try:
        report = Rebuilder(resources, target).rebuild(args.kb, progress=progress).to_dict()
    finally:
        progress.close()
        resources.close()
    report["next_step"] = next_step(settings.milvus, target)
    if args.json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
        return 0
    where = "in place" if report["in_place"] else f"into {report['target_uri']}"
    print(
        f"rebuilt kb {report['kb']} {where} (collection {report['collection']}, isolation {report['isolation']}): "
        f"{report['leaves_written']} leaves "
        f"written ({report['encoded']} encoded, {report['reused']} reused from the embedding cache) in "
        f"{report['seconds']:.1f}s; verified against SQL: {report['milvus_leaves']} leaves"
    )
    if report["next_step"]:
        print(f"next step: {report['next_step']}")
    return 0


def target_settings(
    source: MilvusSettings, *, to_uri: str | None, collection: str | None, isolation: str | None = None
) -> MilvusSettings | None:
    """The Milvus to write into: None = the configured one (in place); otherwise a copy of its settings
    with another URI and/or collection, and ``isolation`` when given (analyzer, HNSW parameters and token carry
    over). A level of its own needs a place of its own: the leaves of one place are at one level."""
    if to_uri is None and collection is None:
        if isolation is not None:
            raise ConfigError("--isolation writes a copy at that level: give --to-uri and/or --collection for it")
        return None
    fields = {
        **source.model_dump(),
        "token": source.token,
        "uri": to_uri or source.uri,
        "collection": collection or source.collection,
        "isolation": isolation or source.isolation,
    }
    try:
        target = MilvusSettings.model_validate(fields)
    except ValidationError as exc:
        reason = (
            describe_validation_error(exc)
            .replace("STRATA_URI", "--to-uri")
            .replace("STRATA_COLLECTION", "--collection")
        )
        raise ConfigError(reason) from None
    if target.is_lite:  # the next step's export must work from any folder
        target = target.model_copy(update={"uri": os.path.abspath(str(target.uri))})
    if _same_place(target, source):
        raise ConfigError(
            f"--to-uri {to_uri} with collection {target.collection} is the configured Milvus itself; "
            "omit --to-uri and --collection to rebuild in place"
        )
    return target


def next_step(source: MilvusSettings, target: MilvusSettings | None) -> str:
    """What the operator does after a verified copy: point strata at it."""
    if target is None:
        return ""
    exports = [f"export STRATA_MILVUS__URI={target.uri}"] if _place(target)[0] != _place(source)[0] else []
    if target.collection != source.collection:
        exports.append(f"export STRATA_MILVUS__COLLECTION={target.collection}")
    if target.isolation != source.isolation:
        exports.append(f"export STRATA_MILVUS__ISOLATION={target.isolation}")
    return " && ".join(exports)


def _same_place(target: MilvusSettings, source: MilvusSettings) -> bool:
    return _place(target) == _place(source)


def _place(settings: MilvusSettings) -> tuple[str, str]:
    uri = str(settings.uri)
    return (os.path.abspath(uri) if settings.is_lite else uri.rstrip("/"), settings.collection)
