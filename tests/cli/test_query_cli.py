"""``strata query``: text, ``--json`` exactly as ``RetrievalResult`` serializes, ``--explain``."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from strata.types import RetrievalResult
from tests.support.paths import EXAMPLES_KB, REPO
from tests.support.processes import STRATA, run_strata, strata_env

pytestmark = pytest.mark.slow  # strata in processes of its own

QUERY = "密码重置链接的有效期、使用次数和频率限制是什么？重置邮件从哪个地址发出，会写审计日志吗？"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    env = strata_env(tmp_path_factory.mktemp("query") / "data")
    done = run_strata(["index", str(EXAMPLES_KB), "--kb", "demo"], env)
    assert done.returncode == 0, done.stderr
    return env


def test_json_is_the_serialized_retrieval_result(env: dict[str, str]) -> None:
    done = run_strata(["query", QUERY, "--kb", "demo", "--top-k", "4", "--json"], env)
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert set(payload) == {"docs", "meta"} and all(set(d) == {"content", "score", "metadata"} for d in payload["docs"])
    result = RetrievalResult.from_dict(payload)
    assert result.to_dict() == payload
    assert result.meta.status == "ok" and result.meta.top_k == 4 and 0 < len(result.docs) <= 4
    assert result.docs[0].metadata["level"] < 3 and result.docs[0].metadata["merged_from"]  # a merged parent


def test_explain_shows_stages_merges_and_traces(env: dict[str, str]) -> None:
    done = run_strata(["query", QUERY, "--kb", "demo", "--explain"], env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert (
        "status ok, strategy auto_merge, mode hybrid" in out and "stage" in out and "encode" in out and "total" in out
    )
    assert "merge round 1:" in out and "merge round 2:" in out and "rerank: skipped (not configured)" in out
    assert "merged from" in out and "auth.md — 用户认证 > 功能规范 > 2. 密码重置" in out


def test_filters_and_failures_show_in_the_exit_status(env: dict[str, str]) -> None:
    done = run_strata(["query", "refund", "--kb", "demo", "--module", "billing", "--json"], env)
    docs = json.loads(done.stdout)["docs"]
    assert docs and {d["metadata"]["module"] for d in docs} == {"billing"}
    missing = run_strata(["query", "refund", "--kb", "nope"], env)
    assert missing.returncode == 1 and "failed" in missing.stdout


def test_a_reader_that_leaves_early_ends_the_command_without_a_traceback(env: dict[str, str]) -> None:
    """``strata query ... | head``: the pipe's reader is gone before strata writes its answer."""
    reader, writer = os.pipe()
    os.close(reader)  # every write to the pipe now fails with EPIPE, as after `head` has read its lines
    try:
        done = subprocess.run(
            [str(STRATA), "query", QUERY, "--kb", "demo"],
            env=env,
            cwd=REPO,
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
        )
    finally:
        os.close(writer)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr
