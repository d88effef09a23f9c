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

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "eval" / "docs-dev"
LANGS = ("zh", "en")


def _checker() -> ModuleType:
    path = ROOT / "scripts" / "check_docs_dev.py"
    spec = importlib.util.spec_from_file_location("check_docs_dev", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


check = _checker()


@pytest.mark.parametrize("lang", LANGS)
def test_every_rule_holds(lang: str) -> None:
    report = check.check_language(lang, BASE)
    assert report.problems == []
    assert report.questions >= check.MIN_QUESTIONS[lang]
    assert report.deep_share >= check.MIN_DEEP_SHARE


@pytest.mark.parametrize("lang", LANGS)
def test_json_matches_the_hand_written_questions(lang: str) -> None:
    """docs_dev_LANG.json is questions.yaml built on the pages (no hand edits of the JSON)."""
    data = json.loads((BASE / lang / f"docs_dev_{lang}.json").read_text(encoding="utf-8"))["data"]
    entries = yaml.safe_load((BASE / lang / "questions.yaml").read_text(encoding="utf-8"))
    built = {
        qa["id"]: (article["id"], qa["question"], qa["answers"][0]["text"])
        for article in data
        for paragraph in article["paragraphs"]
        for qa in paragraph["qas"]
    }
    written = {f"{lang}-{n:04d}": (e["page"], str(e["question"]), str(e["answer"])) for n, e in enumerate(entries)}
    assert built == written


@pytest.mark.parametrize("lang", LANGS)
def test_loads_like_any_squad_set(lang: str) -> None:
    articles, queries = load_squad(BASE / lang / f"docs_dev_{lang}.json")
    pages = sorted(p.stem for p in (BASE / lang / "pages").glob("*.md"))
    assert sorted(a.doc_id for a in articles) == pages
    assert all(len(a.paragraphs) == 1 for a in articles)
    assert all(len(q.answers) == 1 for q in queries)
    asked = {q.doc_id for q in queries}
    assert len(asked) >= 10, "questions should be spread over many pages"


@pytest.mark.parametrize("lang", LANGS)
def test_pages_keep_their_own_headings(lang: str) -> None:
    for page in (BASE / lang / "pages").glob("*.md"):
        lines = page.read_text(encoding="utf-8").split("\n")
        headings = [line for line in lines if re.match(r"#{2,6} ", line)]
        assert len(headings) >= 3, page.name


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
