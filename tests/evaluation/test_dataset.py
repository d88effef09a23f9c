"""SQuAD-style loading, docs/evaluation.md §3's subsample and docs/evaluation.md §2's Markdown corpus."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from strata.errors import LoaderError
from strata.evaluation.dataset import (
    Article,
    Paragraph,
    Query,
    article_markdown,
    load_squad,
    subsample,
    write_corpus,
)
from tests.support.paths import CMRC2018_SUBSET

TINY_SQUAD = {
    "version": "test",
    "data": [
        {
            "title": "北京",
            "id": "ART_A",
            "paragraphs": [
                {
                    "id": "PAR_A1",
                    "context": "北京是中国的首都。\n  它有 两千万人口。",
                    "qas": [
                        {
                            "question": "中国的首都是哪里？",
                            "id": "Q1",
                            "answers": [
                                {"text": "北京", "answer_start": 0},
                                {"text": "北京", "answer_start": 0},
                                {"text": " ", "answer_start": 0},
                                {"text": "北京市", "answer_start": 0},
                            ],
                        },
                    ],
                },
                {
                    # no paragraph id: derived from the article id and index
                    "context": "第二段",
                    "qas": [{"question": "没有答案？", "id": "Q2", "answers": []}],
                },
            ],
        },
        {
            # no article id: its index in data[]
            "title": "上海",
            "paragraphs": [
                {
                    "id": 42,
                    "context": "上海在长江口。",
                    "qas": [{"question": "上海在哪里？", "answers": [{"text": "长江口"}]}],
                },
            ],
        },
    ],
}


def write_json(path: Path, content: object) -> Path:
    path.write_text(json.dumps(content, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.fixture
def tiny_squad(tmp_path: Path) -> Path:
    return write_json(tmp_path / "tiny.json", TINY_SQUAD)


def split_front_matter(text: str) -> tuple[dict[str, str], str]:
    """What a Markdown loader with YAML front matter sees: metadata and body."""
    assert text.startswith("---\n")
    header, body = text[len("---\n") :].split("\n---\n", 1)
    return yaml.safe_load(header), body


# --- load_squad ----------------------------------------------------------------------


def test_load_squad_articles(tiny_squad: Path) -> None:
    articles, _ = load_squad(tiny_squad)

    assert articles == [
        Article(
            doc_id="ART_A",
            title="北京",
            paragraphs=(
                Paragraph("PAR_A1", "北京是中国的首都。\n  它有 两千万人口。"),
                Paragraph("ART_A_1", "第二段"),
            ),
        ),
        Article(doc_id="1", title="上海", paragraphs=(Paragraph("42", "上海在长江口。"),)),
    ]


def test_load_squad_queries_and_gold(tiny_squad: Path) -> None:
    _, queries = load_squad(tiny_squad)

    assert queries == [
        Query("Q1", "中国的首都是哪里？", "ART_A", "PAR_A1", ("北京", "北京市")),
        Query("Q2", "没有答案？", "ART_A", "ART_A_1", ()),
        Query("42_QUERY_0", "上海在哪里？", "1", "42", ("长江口",)),
    ]


def test_paragraphs_belong_to_their_articles(tiny_squad: Path) -> None:
    articles, _ = load_squad(tiny_squad)
    found = {p.paragraph_id: a.doc_id for a in articles for p in a.paragraphs}
    assert found == {"PAR_A1": "ART_A", "ART_A_1": "ART_A", "42": "1"}


def test_duplicate_paragraph_ids_are_refused(tmp_path: Path) -> None:
    article = {"title": "t", "paragraphs": [{"id": "P", "context": "c", "qas": []}] * 2}
    path = write_json(tmp_path / "dup.json", {"data": [article]})
    with pytest.raises(LoaderError, match="paragraph id 'P'"):
        load_squad(path)


def test_missing_context_names_its_place(tmp_path: Path) -> None:
    path = write_json(tmp_path / "bad.json", {"data": [{"title": "t", "paragraphs": [{}]}]})
    with pytest.raises(LoaderError, match=r"data\[0\]\.paragraphs\[0\]: missing 'context'"):
        load_squad(path)


def test_unreadable_json_is_a_loader_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(LoaderError):
        load_squad(path)


# --- subsample -----------------------------------------------------------------------


def numbered_queries(count: int) -> list[Query]:
    return [Query(f"q{i}", f"question {i}", "d", "p", ("a",)) for i in range(count)]


def test_subsample_matches_spec_and_keeps_file_order() -> None:
    queries = numbered_queries(20)
    expected = sorted(random.Random(13).sample(range(20), 7))

    picked = subsample(queries, 7)

    assert [int(q.query_id[1:]) for q in picked] == expected
    assert subsample(queries, 7, seed=14) != picked


def test_subsample_of_everything() -> None:
    queries = numbered_queries(5)
    assert subsample(queries, None) == queries
    assert subsample(queries, 5) == queries
    assert subsample(queries, 500) == queries
    assert subsample(queries, 0) == []
    with pytest.raises(ValueError):
        subsample(queries, -1)


# --- corpus --------------------------------------------------------------------------


def test_article_markdown_is_spec_text_without_trailing_newline(tiny_squad: Path) -> None:
    articles, _ = load_squad(tiny_squad)

    assert article_markdown(articles[0]) == (
        "# 北京\n\n## 段落 1\n\n北京是中国的首都。\n  它有 两千万人口。\n\n## 段落 2\n\n第二段"
    )
    assert article_markdown(articles[1]) == "# 上海\n\n## 段落 1\n\n上海在长江口。"


def test_write_corpus_front_matter_and_body(tiny_squad: Path, tmp_path: Path) -> None:
    articles, _ = load_squad(tiny_squad)
    out_dir = tmp_path / "corpus"

    files = write_corpus(articles, out_dir)

    assert files == {"00000.md": "ART_A", "00001.md": "1"}
    for name, article in zip(files, articles):
        meta, body = split_front_matter((out_dir / name).read_text(encoding="utf-8"))
        assert meta == {"doc_id": article.doc_id, "title": article.title}
        assert body == article_markdown(article)


def test_write_corpus_quotes_awkward_ids_and_titles(tmp_path: Path) -> None:
    awkward = [
        Article("0", "yes: no # not a comment", (Paragraph("p0", "正文"),)),
        Article("1e3", "---\n多行\n---", (Paragraph("p1", "正文"),)),
    ]
    files = write_corpus(awkward, tmp_path)

    for name, article in zip(files, awkward):
        meta, body = split_front_matter((tmp_path / name).read_text(encoding="utf-8"))
        assert meta == {"doc_id": article.doc_id, "title": article.title}
        assert body == article_markdown(article)


def test_write_corpus_reruns_but_refuses_foreign_files(tmp_path: Path) -> None:
    one = [Article("A", "t", (Paragraph("p", "c"),))]
    write_corpus(one, tmp_path)
    write_corpus(one, tmp_path)  # overwriting its own files is fine

    (tmp_path / "notes.txt").write_text("x", encoding="utf-8")
    with pytest.raises(FileExistsError, match=r"notes\.txt"):
        write_corpus(one, tmp_path)


def test_write_corpus_refuses_duplicate_doc_ids(tmp_path: Path) -> None:
    twice = [Article("A", "t", ()), Article("A", "u", ())]
    with pytest.raises(ValueError, match="'A'"):
        write_corpus(twice, tmp_path)


def test_an_rst_article_is_indexed_as_rst_with_its_id(tmp_path: Path) -> None:
    """A ``format: "rst"`` article is written as a .rst file the rst loader reads, its id in the field list."""
    from strata.indexing.loaders._rst import parse_rst

    page = "Configuration\n=============\n\nSet ``DEBUG`` to turn on the debugger.\n\nKeys\n----\n\nMore.\n"
    raw = {
        "data": [
            {
                "title": "Configuration",
                "id": "flask-config",
                "format": "rst",
                "paragraphs": [{"id": "p", "context": page, "qas": []}],
            }
        ]
    }
    source = tmp_path / "set.json"
    source.write_text(json.dumps(raw), encoding="utf-8")
    articles, _ = load_squad(source)
    assert articles[0].format == "rst"

    files = write_corpus(articles, tmp_path / "corpus")

    assert files == {"00000.rst": "flask-config"}
    parsed = parse_rst((tmp_path / "corpus" / "00000.rst").read_bytes())
    assert parsed.metadata["doc_id"] == "flask-config"  # what load_document takes as the doc_id
    assert "Set DEBUG to turn on the debugger." in parsed.text
    assert [s.heading_path for s in parsed.sections] == [("Configuration",), ("Configuration", "Keys")]


@pytest.mark.parametrize("bad", [{"format": "html"}, {"format": "rst", "id": "a b"}])
def test_an_unknown_format_or_an_unsafe_rst_id_is_refused(tmp_path: Path, bad: dict) -> None:
    raw = {"data": [{"title": "t", "id": "a", "paragraphs": [{"context": "c"}], **bad}]}
    source = tmp_path / "set.json"
    source.write_text(json.dumps(raw), encoding="utf-8")
    with pytest.raises(LoaderError, match="data\\[0\\]"):
        load_squad(source)


# --- a subset of the real development set (tests/fixtures) ------------------------------


def test_cmrc2018_subset_counts() -> None:
    articles, queries = load_squad(CMRC2018_SUBSET)

    assert len(articles) == 100
    assert sum(len(a.paragraphs) for a in articles) == 100
    assert len(queries) == 418
    assert len({p.paragraph_id for a in articles for p in a.paragraphs}) == 100
    assert articles[0].doc_id == "DEV_0"
    assert queries[0].answers == ("光荣和ω-force",)  # three identical answers collapse


def test_subsample_is_seed_13_over_the_question_order() -> None:
    _, queries = load_squad(CMRC2018_SUBSET)
    expected = [queries[i] for i in sorted(random.Random(13).sample(range(418), 100))]
    assert subsample(queries, 100) == expected
