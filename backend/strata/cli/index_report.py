"""The report of ``strata index``, local or through ``--server``: printed as text or ``--json``."""

from __future__ import annotations

import json
import signal
import threading
from typing import Any


def print_report(report: dict[str, Any], *, as_json: bool) -> None:
    """Prints the run's report; from here on the run's exit code is final (see ``outcome_is_final``)."""
    outcome_is_final()
    if as_json:
        print(json.dumps(report, ensure_ascii=False, indent=2))
        return
    verb = "would change" if report["dry_run"] else "indexed"
    print(
        f"{verb} kb {report['kb']}: {report['added']} added, {report['updated']} updated, "
        f"{report['unchanged']} unchanged, {report['deleted']} deleted, {report['failed']} failed; "
        f"{report['passages_encoded']} passages encoded ({report['embeddings_reused']} reused), "
        f"{report['chunks_written']} chunks written in {report['seconds']:.1f}s ({report['chunks_per_s']:.1f} chunks/s)"
    )
    for failure in report["failures"]:
        print(f"  FAILED {failure['source']}: {failure['reason']}")
    for skipped in report["skipped"]:
        print(f"  skipped {skipped['source']}: {skipped['reason']}")
    for warning in report["warnings"]:
        print(f"  warning {warning['source']}: {warning['note']}")
    for note in report["notes"]:
        print(f"  note: {note}")


def outcome_is_final() -> None:
    """Ignores Ctrl-C from now on: the run is over, and a SIGINT while its report prints or while the stores close
    at exit would otherwise turn a printed report into exit 130 (interrupted) instead of the run's own code."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
