"""The documentation dev set (eval/docs-dev/, issue 36) obeys its rules and loads like CMRC.

Runs on the committed files only: the pages, the hand-written questions and the
SQuAD-style files built from them by scripts/build_docs_dev.py. The rules are
scripts/check_docs_dev.py's (see its docstring).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from strata.evaluation.dataset import load_squad
from strata.indexing.loaders._rst import parse_rst

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "eval" / "docs-dev"


def _checker() -> ModuleType:
    path = ROOT / "scripts" / "check_docs_dev.py"
    spec = importlib.util.spec_from_file_location("check_docs_dev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


check = _checker()
SETS = check.sets(BASE)


def test_the_sets_are_found() -> None:
    assert {"zh", "en"} <= set(SETS)
    assert {check.language(name) for name in SETS} == {"zh", "en"}


@pytest.mark.parametrize("name", SETS)
def test_every_rule_holds(name: str) -> None:
    report = check.check_set(name, BASE)
    assert report.problems == []
    assert report.questions >= check.minimum_questions(name)
    assert report.deep_share >= check.MIN_DEEP_SHARE


@pytest.mark.parametrize("name", SETS)
def test_json_matches_the_hand_written_questions(name: str) -> None:
    """docs_dev_SET.json is questions.yaml built on the pages (no hand edits of the JSON)."""
    data = json.loads((BASE / name / f"docs_dev_{name}.json").read_text(encoding="utf-8"))["data"]
    entries = yaml.safe_load((BASE / name / "questions.yaml").read_text(encoding="utf-8"))
    built = {
        qa["id"]: (article["id"], qa["question"], qa["answers"][0]["text"])
        for article in data
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }
    written = {f"{name}-{n:04d}": (e["page"], str(e["question"]), str(e["answer"])) for n, e in enumerate(entries)}
    assert built == written


@pytest.mark.parametrize("name", SETS)
def test_loads_like_any_squad_set(name: str) -> None:
    articles, queries = load_squad(BASE / name / f"docs_dev_{name}.json")
    pages = {p.stem: p.suffix for p in (BASE / name / "pages").iterdir() if p.suffix in (".md", ".rst")}
    assert sorted(a.doc_id for a in articles) == sorted(pages)
    assert {a.doc_id: a.format for a in articles} == {
        stem: "rst" if suffix == ".rst" else "markdown" for stem, suffix in pages.items()
    }
    assert all(len(a.paragraphs) == 1 for a in articles)
    assert all(len(q.answers) == 1 for q in queries)
    asked = {q.doc_id for q in queries}
    assert len(asked) >= check.MIN_PAGES_ASKED, "questions should be spread over many pages"


@pytest.mark.parametrize("name", SETS)
def test_pages_keep_their_own_headings(name: str) -> None:
    for page in (BASE / name / "pages").glob("*.md"):
        lines = page.read_text(encoding="utf-8").split("\n")
        headings = [line for line in lines if re.match(r"#{2,6} ", line)]
        assert len(headings) >= 3, page.name
    for page in (BASE / name / "pages").glob("*.rst"):
        sections = parse_rst(page.read_bytes()).sections
        assert len({s.heading_path for s in sections}) >= 3, page.name


def test_copy_rule_catches_a_copied_clause() -> None:
    context = "前言。\n-s 从每个 报文 中 截取 snaplen 字节的数据, 而不是 缺省的 68。\n"
    start = context.index("68")
    sentence = check.answer_sentence(context, start, 2, "zh")
    held = check.tokens(sentence, "zh")
    copied = check.longest_common_run(check.tokens("从每个报文中截取多少字节？", "zh"), held)
    assert copied >= check.MAX_COPY["zh"]
    paraphrase = check.longest_common_run(check.tokens("抓包时缺省只保留每个包开头的多少字节？", "zh"), held)
    assert paraphrase < check.MAX_COPY["zh"]


def test_short_answer_line_takes_in_its_description() -> None:
    context = "Intro.\n--no-wall\n在执行 halt, poweroff, reboot 动作前，不发送警告消息。\n"
    start = context.index("--no-wall")
    sentence = check.answer_sentence(context, start, len("--no-wall"), "zh")
    assert "不发送警告消息" in sentence
