"""Check the documentation dev set (eval/docs-dev/) against issue 36's rules.

For each set (every folder holding a ``questions.yaml``: ``zh``, ``en``, ``zh-npm``, ``en-rst``, ...; its
language is its name up to the first ``-``) the SQuAD-style file ``docs_dev_SET.json`` and the page files
``pages/*.md`` and ``pages/*.rst`` must satisfy:

1. **Pages**: one article per page file, ``id`` = the file's stem, a single
   paragraph whose ``context`` equals the file's text exactly.
2. **Offsets**: every answer's ``text`` is non-blank and equals
   ``context[answer_start : answer_start + len(text)]``.
3. **Rarity**: every answer text occurs, compared as the metric compares
   (``norm`` = all whitespace removed, docs/evaluation.md §5), in at most
   ``MAX_PAGES`` = 2 pages of its set, its own page included. An answer on an rst page must also be in the
   text strata's rst loader indexes of it (markup dropped), whitespace removed.
4. **Depth**: at least ``MIN_DEEP_SHARE`` = 20 % of the answers start at
   character ``DEEP_FROM`` = 3,000 of their page or later.
5. **Counts**: at least ``MIN_QUESTIONS`` questions (zh 150, en 100; every later set
   ``MIN_QUESTIONS_LATER`` = 80 over at least ``MIN_PAGES_ASKED`` = 8 pages); question ids unique.
6. **No copying**: the question does not contain the answer, and it shares
   fewer than ``MAX_COPY`` consecutive tokens with the sentence holding the
   answer: zh 8 tokens, en 6 tokens (at most 7 and 5 in a row). Both texts
   are lower-cased and cut into tokens. en: a run of ASCII letters, digits
   and ``_`` is one token, every other non-blank character one token. zh
   (whitespace removed first): a run of printable ASCII characters is one
   token (a name, path or option such as ``/proc/self/fd/n`` or
   ``--flush``), every Chinese or other non-ASCII character one token. The
   sentence holding the answer is the text around ``answer_start`` up to the
   nearest sentence end on each side (``。！？；`` and a newline; en also
   ``.``, ``!``, ``?``, ``;`` before a blank); when it is shorter than
   ``SHORT_SENTENCE`` = 30 characters (an option's name on a line of its
   own, a table cell) the next sentence, which describes it, is
   added. So a question may name the option, command or file it is about,
   but not repeat a clause: seven Chinese characters are about three words.

    python scripts/check_docs_dev.py [--set NAME ...] [--min-zh 150] [--min-en 100]

Exit status 1 and one line per problem when a rule fails; ``check_set``
returns the problems and the figures so the test can use it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "eval" / "docs-dev"

MAX_PAGES = 2
DEEP_FROM = 3000
MIN_DEEP_SHARE = 0.20
MIN_QUESTIONS = {"zh": 150, "en": 100}  # the two first sets; every later set (zh-npm, en-rst, ...) needs
MIN_QUESTIONS_LATER = 80  # this many questions, over at least
MIN_PAGES_ASKED = 8  # this many pages
MAX_COPY = {"zh": 8, "en": 6}
SHORT_SENTENCE = 30
_TOKEN = {"en": re.compile(r"[a-z0-9_]+|\S"), "zh": re.compile(r"[\x21-\x7e]+|\S")}

_WS = re.compile(r"\s+")


def norm(text: str) -> str:
    """docs/evaluation.md §5's normalisation: all whitespace removed."""
    return _WS.sub("", text)


def _fold(text: str, lang: str) -> str:
    text = text.lower()
    return _WS.sub("", text) if lang == "zh" else _WS.sub(" ", text).strip()


def tokens(text: str, lang: str) -> list[str]:
    """Rule 6's tokens of a text (lower-cased; zh: whitespace removed first)."""
    return _TOKEN[lang].findall(_fold(text, lang))


def longest_common_run(a: list[str], b: list[str]) -> int:
    """Length of the longest run of consecutive items common to a and b (O(len a × len b))."""
    if not a or not b:
        return 0
    best = 0
    previous = [0] * (len(b) + 1)
    for ca in a:
        current = [0] * (len(b) + 1)
        for j, cb in enumerate(b, start=1):
            if ca == cb:
                current[j] = previous[j - 1] + 1
                if current[j] > best:
                    best = current[j]
        previous = current
    return best


def _sentence_ends(lang: str) -> re.Pattern[str]:
    return re.compile(r"[。！？；\n]") if lang == "zh" else re.compile(r"[.!?;](?=\s)|\n")


def answer_sentence(context: str, start: int, length: int, lang: str) -> str:
    """The sentence of ``context`` holding ``[start, start + length)``, plus the next if it is short."""
    ends = _sentence_ends(lang)
    left = 0
    for before in ends.finditer(context, 0, start):
        left = before.end()
    right = start + length
    while True:
        after = ends.search(context, right)
        right = after.end() if after else len(context)
        if len(context[left:right].strip()) >= SHORT_SENTENCE or right >= len(context):
            return context[left:right]


def language(name: str) -> str:
    """A set's language: its name up to the first ``-`` (``zh-rst`` -> ``zh``)."""
    return name.split("-", 1)[0]


def sets(base: Path = BASE) -> list[str]:
    """Every folder of the dev set holding a questions.yaml."""
    return sorted(p.parent.name for p in base.glob("*/questions.yaml"))


def minimum_questions(name: str) -> int:
    return MIN_QUESTIONS.get(name, MIN_QUESTIONS_LATER)


def rendered_rst(text: str) -> str:
    """The text strata's rst loader indexes of a page (markup dropped), whitespace removed."""
    from strata.indexing.loaders._rst import parse_rst

    return norm(parse_rst(text.encode("utf-8")).text)


@dataclass
class Report:
    name: str  # the set
    questions: int = 0
    pages: int = 0
    deep: int = 0
    max_copy: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def deep_share(self) -> float:
        return self.deep / self.questions if self.questions else 0.0


def check_set(name: str, base: Path = BASE, min_questions: int | None = None) -> Report:
    lang = language(name)
    report = Report(name)
    folder = base / name
    data_path = folder / f"docs_dev_{name}.json"
    data = json.loads(data_path.read_text(encoding="utf-8"))["data"]
    paths = sorted([*(folder / "pages").glob("*.md"), *(folder / "pages").glob("*.rst")])
    page_files = {p.stem: p.read_text(encoding="utf-8") for p in paths}
    rst_pages = {p.stem for p in paths if p.suffix == ".rst"}
    asked: set[str] = set()
    report.pages = len(data)
    problems = report.problems
    if sorted(a["id"] for a in data) != sorted(page_files):
        problems.append(f"{name}: articles {sorted(a['id'] for a in data)} != page files {sorted(page_files)}")
    normalized_pages = {a["id"]: norm("".join(p["context"] for p in a["paragraphs"])) for a in data}
    seen_ids: set[str] = set()
    for article in data:
        if (article.get("format") == "rst") != (article["id"] in rst_pages):
            problems.append(f"{name}/{article['id']}: format {article.get('format')!r} does not match its page file")
        rendered = rendered_rst(page_files.get(article["id"], "")) if article["id"] in rst_pages else None
        if len(article["paragraphs"]) != 1:
            problems.append(f"{name}/{article['id']}: {len(article['paragraphs'])} paragraphs, expected 1")
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            if page_files.get(article["id"]) != context:
                problems.append(f"{name}/{article['id']}: context differs from pages/{article['id']}.md")
            for qa in paragraph["qas"]:
                report.questions += 1
                qid, question = qa["id"], qa["question"]
                if qid in seen_ids:
                    problems.append(f"{name}/{qid}: repeated question id")
                seen_ids.add(qid)
                if len(qa["answers"]) != 1:
                    problems.append(f"{name}/{qid}: {len(qa['answers'])} answers, expected 1")
                    continue
                answer = qa["answers"][0]
                text, start = answer["text"], answer["answer_start"]
                if not text.strip() or context[start : start + len(text)] != text:
                    problems.append(f"{name}/{qid}: answer {text!r} not at {start} of {article['id']}")
                    continue
                asked.add(article["id"])
                if rendered is not None and norm(text) not in rendered:
                    problems.append(f"{name}/{qid}: answer {text!r} is not in the text the rst loader indexes")
                if start >= DEEP_FROM:
                    report.deep += 1
                holders = [name for name, page in normalized_pages.items() if norm(text) in page]
                if len(holders) > MAX_PAGES:
                    problems.append(f"{name}/{qid}: answer {text!r} occurs in {len(holders)} pages: {holders}")
                folded_q = _fold(question, lang)
                if _fold(text, lang) in folded_q:
                    problems.append(f"{name}/{qid}: question contains its answer {text!r}")
                sentence = answer_sentence(context, start, len(text), lang)
                copied = longest_common_run(tokens(question, lang), tokens(sentence, lang))
                report.max_copy = max(report.max_copy, copied)
                if copied >= MAX_COPY[lang]:
                    problems.append(
                        f"{name}/{qid}: question shares {copied} tokens with its answer sentence "
                        f"(limit {MAX_COPY[lang] - 1}): {question!r} / {sentence.strip()[:120]!r}"
                    )
    needed = minimum_questions(name) if min_questions is None else min_questions
    if name not in MIN_QUESTIONS and len(asked) < MIN_PAGES_ASKED:
        problems.append(f"{name}: questions on {len(asked)} pages, at least {MIN_PAGES_ASKED} required")
    if report.questions < needed:
        problems.append(f"{name}: {report.questions} questions, at least {needed} required")
    if report.questions and report.deep_share < MIN_DEEP_SHARE:
        problems.append(f"{name}: {report.deep_share:.1%} of answers past character {DEEP_FROM}, at least 20% required")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--set", dest="names", action="append", help="a set (zh, en, zh-npm, ...); every set by default"
    )
    parser.add_argument("--min-zh", type=int, default=MIN_QUESTIONS["zh"])
    parser.add_argument("--min-en", type=int, default=MIN_QUESTIONS["en"])
    parser.add_argument("--base", type=Path, default=BASE)
    args = parser.parse_args()
    failed = False
    floors = {"zh": args.min_zh, "en": args.min_en}
    for name in args.names or sets(args.base):
        report = check_set(name, args.base, floors.get(name))
        print(
            f"{name}: {report.questions} questions on {report.pages} pages, "
            f"{report.deep} ({report.deep_share:.0%}) past character {DEEP_FROM}, "
            f"longest copy {report.max_copy} tokens (limit {MAX_COPY[language(name)] - 1})"
        )
        for problem in report.problems:
            print("  " + problem)
        failed = failed or bool(report.problems)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
