#!/usr/bin/env python
"""Build or update a knowledge base: a thin wrapper around ``strata index``.

    python scripts/build_index.py --source docs/ --source faq.md --kb demo [--delete-missing]
        [--recreate] [--batch-size N] [--dry-run] [--json]

Settings come from ``STRATA_*`` variables exactly as for ``strata``; the exit
status is ``strata index``'s (0 ok, 1 some file failed, 2 configuration error).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from strata.cli import add_index_options
from strata.cli import main as strata_main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", required=True, help="a file or folder to index (repeatable)")
    add_index_options(parser)
    return parser.parse_args(argv)


def strata_argv(args: argparse.Namespace) -> list[str]:
    """The equivalent ``strata index`` command line."""
    argv = ["index", *args.source, "--kb", args.kb]
    switches = ("delete_missing", "recreate", "dry_run", "json")
    argv += ["--" + name.replace("_", "-") for name in switches if getattr(args, name)]
    if args.batch_size is not None:
        argv += ["--batch-size", str(args.batch_size)]
    return argv


if __name__ == "__main__":
    sys.exit(strata_main(strata_argv(parse_args())))
