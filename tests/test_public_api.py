"""``import strata`` gives what a user needs (the calls, records, clients and errors) and loads no engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

import strata

pytestmark = pytest.mark.integration  # a short subprocess: a fresh interpreter's modules

HEAVY = ("torch", "pymilvus", "sqlalchemy", "redis", "numpy", "FlagEmbedding", "sentence_transformers")


def test_every_exported_name_resolves_to_its_definition() -> None:
    for name in strata.__all__:
        value = getattr(strata, name)
        assert value.__name__ == name and value.__module__.startswith("strata."), name
    assert issubclass(strata.InvalidArgumentError, (strata.StrataError, ValueError))
    assert issubclass(strata.ServiceError, strata.StrataError)


def test_importing_strata_and_its_records_clients_and_errors_loads_no_engine() -> None:
    light = [n for n in strata.__all__ if n not in ("retrieve_documents", "aretrieve_documents", "Retriever")]
    code = (
        "import sys, strata\n"
        f"for name in {light!r}: getattr(strata, name)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
