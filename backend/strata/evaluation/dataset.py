"""SQuAD-style QA sets turned into a retrieval benchmark (docs/evaluation.md §1–§3).

``load_squad`` reads ``data[] -> {title, id, paragraphs[] -> {id, context,
qas[] -> {question, id, answers[] -> {text}}}}`` into ``Article`` and ``Query``
records; ``subsample`` picks docs/evaluation.md §3's fixed subsample; ``article_markdown``
and ``write_corpus`` build docs/evaluation.md §2's corpus, one Markdown file per article.

Nothing here depends on one file's particulars (CMRC 2018 has one paragraph per
article; other sets have many). Missing ids are derived, never invented at
random, so a rerun gives the same ids:

- an article without ``id`` gets its 0-based index in ``data`` (``"3"``);
- a paragraph without ``id`` gets ``f"{doc_id}_{i}"``, ``i`` its 0-based index
  in the article;
- a question without ``id`` gets ``f"{paragraph_id}_QUERY_{j}"``, ``j`` its
  0-based index in the paragraph.

Ids are compared as strings (some sets use integers); a null id counts as
missing. Article, paragraph and question ids must each be unique in a file; a
duplicate is a ``LoaderError``, because the gold of a query would otherwise be
ambiguous.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from strata.errors import InvalidArgumentError, LoaderError

SUBSAMPLE_SEED = 13
# an rst article's id goes into a field list line unquoted: no markup, no line break
_SAFE_RST_ID = re.compile(r"[A-Za-z0-9_.-]+")
PARAGRAPH_HEADING = "段落"

# PyYAML wraps long scalars at 80 columns by default; one line per key reads better.
_NO_LINE_WRAP = 2**31


@dataclass(frozen=True)
class Paragraph:
    """One passage of an article; ``context`` is kept verbatim."""

    paragraph_id: str
    context: str


@dataclass(frozen=True)
class Article:
    """One article of the set: it becomes one corpus document with ``doc_id``."""

    doc_id: str
    title: str
    paragraphs: tuple[Paragraph, ...]
    # "markdown" (docs/evaluation.md §2's wrapper) or "rst": a reStructuredText page indexed as itself (one
    # paragraph whose context is the whole page; the docs dev set's rst sets, eval/docs-dev/README.md)
    format: str = "markdown"


@dataclass(frozen=True)
class Query:
    """One question and its gold: article, paragraph and answer strings.

    ``answers`` holds the distinct non-blank answer texts in first-seen order,
    verbatim. A question without any is kept (docs/evaluation.md §3 counts every question of
    the file) and can never be an answer hit.
    """

    query_id: str
    question: str
    doc_id: str
    paragraph_id: str
    answers: tuple[str, ...]


def load_squad(path: Path) -> tuple[list[Article], list[Query]]:
    """Read a SQuAD-style JSON file into articles and queries, both in file order.

    Raises ``LoaderError`` when the file is not JSON, lacks a required field
    (``data``, ``title``, ``context``, ``question``) or repeats an id.
    """
    raw = _read_json(path)
    articles: list[Article] = []
    queries: list[Query] = []
    for index, raw_article in enumerate(_require(raw, "data", str(path))):
        article, article_queries = _parse_article(raw_article, index)
        articles.append(article)
        queries.extend(article_queries)
    _require_unique((a.doc_id for a in articles), "article id", path)
    paragraph_ids = (p.paragraph_id for a in articles for p in a.paragraphs)
    _require_unique(paragraph_ids, "paragraph id", path)
    _require_unique((q.query_id for q in queries), "question id", path)
    return articles, queries


def subsample(queries: Sequence[Query], n: int | None, seed: int = SUBSAMPLE_SEED) -> list[Query]:
    """docs/evaluation.md §3's fixed subsample of ``n`` queries, in file order.

    ``random.Random(seed).sample(range(N), n)`` over the queries in file order,
    re-sorted into file order. ``n`` None or ``n >= N`` returns every query.
    """
    if n is None or n >= len(queries):
        return list(queries)
    if n < 0:
        raise InvalidArgumentError(f"subsample size must be >= 0, got {n}")
    picked = random.Random(seed).sample(range(len(queries)), n)
    return [queries[i] for i in sorted(picked)]


def article_markdown(article: Article) -> str:
    """docs/evaluation.md §2's document text of an article, with no trailing newline.

    ``# {title}``, then per paragraph i = 1, 2, …: a blank line, ``## 段落 {i}``,
    a blank line and the context verbatim.
    """
    parts = [f"# {article.title}"]
    for i, paragraph in enumerate(article.paragraphs, start=1):
        parts.append(f"## {PARAGRAPH_HEADING} {i}\n\n{paragraph.context}")
    return "\n\n".join(parts)


def article_text(article: Article) -> str:
    """The text an article is indexed from: ``article_markdown``, or an rst article's page verbatim."""
    if article.format == "rst":
        return "\n\n".join(p.context for p in article.paragraphs)
    return article_markdown(article)


def write_corpus(articles: Sequence[Article], out_dir: Path) -> dict[str, str]:
    """Write one Markdown file per article; return ``relative file name -> doc_id``.

    An rst article (``format: "rst"``) is written as ``NNNNN.rst``: an opening field list holding ``doc_id``
    (docutils' bibliographic fields, which strata's rst loader reads as metadata), a blank line, then its page.

    Files are named ``00000.md``, ``00001.md``… by article position, so any id is
    safe. Each starts with a YAML front matter holding ``doc_id`` and ``title``
    (every scalar double-quoted, one line each), which strata's Markdown loader
    reads as the document id and strips, leaving exactly ``article_markdown``.

    ``out_dir`` is created if needed. It must hold nothing but this corpus's
    files (a rerun overwrites them): any other file would be indexed too, so
    its presence raises ``FileExistsError`` before anything is written.
    """
    duplicate = _first_duplicate(a.doc_id for a in articles)
    if duplicate is not None:
        raise InvalidArgumentError(f"two articles share doc_id {duplicate!r}")
    names = {f"{index:05d}.{_SUFFIX[a.format]}": a for index, a in enumerate(articles)}
    out_dir.mkdir(parents=True, exist_ok=True)
    _refuse_foreign_files(out_dir, names.keys())
    for name, article in names.items():
        if article.format == "rst":
            text = f":doc_id: {article.doc_id}\n\n{article_text(article)}"
        else:
            text = _front_matter(article) + article_markdown(article)
        # newline="" keeps "\n" on every platform: the text must stay verbatim.
        (out_dir / name).write_text(text, encoding="utf-8", newline="")
    return {name: article.doc_id for name, article in names.items()}


_SUFFIX = {"markdown": "md", "rst": "rst"}


def _front_matter(article: Article) -> str:
    fields = {"doc_id": article.doc_id, "title": article.title}
    header = yaml.safe_dump(fields, allow_unicode=True, sort_keys=False, default_style='"', width=_NO_LINE_WRAP)
    return f"---\n{header}---\n"


def _refuse_foreign_files(out_dir: Path, own_names: Iterable[str]) -> None:
    own = set(own_names)
    found = (p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file())
    foreign = sorted(name for name in found if name not in own)
    if foreign:
        shown = ", ".join(foreign[:5])
        raise FileExistsError(f"{out_dir} holds files that are not part of this corpus: {shown}")


def _read_json(path: Path) -> Any:
    try:
        with path.open(encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoaderError(f"cannot read SQuAD-style JSON {path}: {exc}") from exc


def _parse_article(raw: Any, index: int) -> tuple[Article, list[Query]]:
    where = f"data[{index}]"
    title = str(_require(raw, "title", where))
    doc_id = _id_or(raw, str(index))
    text_format = str(raw.get("format", "markdown"))
    if text_format not in _SUFFIX:
        raise LoaderError(f"{where}: format {text_format!r} is not one of {sorted(_SUFFIX)}")
    if text_format == "rst" and not _SAFE_RST_ID.fullmatch(doc_id):
        raise LoaderError(f"{where}: an rst article's id must match {_SAFE_RST_ID.pattern}, got {doc_id!r}")
    paragraphs: list[Paragraph] = []
    queries: list[Query] = []
    for i, raw_paragraph in enumerate(raw.get("paragraphs", ())):
        paragraph, paragraph_queries = _parse_paragraph(raw_paragraph, doc_id, where, i)
        paragraphs.append(paragraph)
        queries.extend(paragraph_queries)
    return Article(doc_id=doc_id, title=title, paragraphs=tuple(paragraphs), format=text_format), queries


def _parse_paragraph(raw: Any, doc_id: str, where: str, index: int) -> tuple[Paragraph, list[Query]]:
    where = f"{where}.paragraphs[{index}]"
    context = str(_require(raw, "context", where))
    paragraph = Paragraph(paragraph_id=_id_or(raw, f"{doc_id}_{index}"), context=context)
    queries = [
        _parse_query(raw_qa, paragraph, doc_id, f"{where}.qas[{j}]", j) for j, raw_qa in enumerate(raw.get("qas", ()))
    ]
    return paragraph, queries


def _parse_query(raw: Any, paragraph: Paragraph, doc_id: str, where: str, index: int) -> Query:
    question = str(_require(raw, "question", where))
    return Query(
        query_id=_id_or(raw, f"{paragraph.paragraph_id}_QUERY_{index}"),
        question=question,
        doc_id=doc_id,
        paragraph_id=paragraph.paragraph_id,
        answers=_distinct_answers(raw.get("answers", ()), f"{where}.answers"),
    )


def _distinct_answers(raw_answers: Iterable[Any], where: str) -> tuple[str, ...]:
    # A blank answer would be "inside" every text once whitespace is removed.
    texts = (str(_require(a, "text", where)) for a in raw_answers)
    return tuple(dict.fromkeys(t for t in texts if t.strip()))


def _id_or(raw: Mapping[str, Any], derived: str) -> str:
    """The record's ``id`` as a string, or the derived id when absent or null."""
    value = raw.get("id")
    return derived if value is None else str(value)


def _require(raw: Any, key: str, where: str) -> Any:
    if not isinstance(raw, Mapping) or key not in raw:
        raise LoaderError(f"{where}: missing {key!r}")
    return raw[key]


def _require_unique(ids: Iterable[str], what: str, path: Path) -> None:
    duplicate = _first_duplicate(ids)
    if duplicate is not None:
        raise LoaderError(f"{path}: {what} {duplicate!r} occurs more than once")


def _first_duplicate(ids: Iterable[str]) -> str | None:
    seen: set[str] = set()
    for value in ids:
        if value in seen:
            return value
        seen.add(value)
    return None
