"""Where the repository and the data the tests read are: never a path outside the repository."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

EXAMPLES_KB = REPO / "examples" / "kb"


# 100 articles of the CMRC 2018 dev set (CC BY-SA 4.0, see tests/fixtures/README.md): tests never read outside the repo
CMRC2018_SUBSET = REPO / "tests" / "fixtures" / "cmrc2018_dev_subset.json"
