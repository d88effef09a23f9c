"""The BM25 analyzer's tokens computed here are the tokens Milvus Lite's own analyzer yields."""

from __future__ import annotations

from pathlib import Path

import pytest
from milvus_lite.analyzer.factory import create_analyzer

from strata.errors import UnsupportedAnalyzer
from strata.stores.analyzer import analyzer_tokenizer, is_punctuation, lite_analyzer_problem
from strata.stores.leaf_index import LeafIndex
from strata.stores.leaf_schema import analyzer_with_dictionary
from tests.support.milvus import MILVUS_SERVER_RUN, MilvusTarget

TEXTS = [
    "密码重置链接的有效期、使用次数和频率限制是什么？重置邮件从哪个地址发出，会写审计日志吗？",
    "How do I filter the Search results by tag?  C++ / API-key_x 两步验证 v2.1 ",
    "",
]
PARAMS = [
    {"tokenizer": "jieba"},
    {"tokenizer": {"type": "jieba", "mode": "exact"}},
    analyzer_with_dictionary({"tokenizer": "jieba"}, ["两步验证"]),  # what a new collection gets
    {"tokenizer": "jieba", "filter": [{"type": "stop", "stop_words": ["的", "是"]}]},
    {"tokenizer": "standard", "filter": [{"type": "stop", "stop_words": ["the", "by"]}]},
    {"type": "standard"},
    None,
]


@pytest.mark.parametrize("params", PARAMS, ids=str)
def test_tokens_match_milvus_lite(params) -> None:
    milvus = create_analyzer(params)  # with a dictionary, this adds its words to jieba, as opening the collection does
    ours = analyzer_tokenizer(params)
    for text in TEXTS:
        assert ours(text) == milvus.tokenize(text)


def test_other_tokenizers_are_refused_with_the_reason() -> None:
    with pytest.raises(UnsupportedAnalyzer, match="'icu'"):
        analyzer_tokenizer({"tokenizer": "icu"})
    with pytest.raises(UnsupportedAnalyzer, match="neither"):
        analyzer_tokenizer({"tokenizer": ["jieba"]})


def test_punctuation_tokens() -> None:
    assert [is_punctuation(t) for t in ["？", "、", "...", "+", "©", "c++", "v2", "的"]] == [True] * 5 + [False] * 3


# -- what Milvus Lite can build (issue "Nothing lost, nothing stale, nothing unbounded", item 7) ----------


@pytest.mark.parametrize(
    "params, refused",
    [
        ({"type": "english"}, "tokenizer 'english'"),
        ({"tokenizer": "standard", "filter": ["lowercase", {"type": "stemmer", "language": "english"}]}, "stemmer"),
        ({"tokenizer": "standard", "filter": [{"type": "stop", "stop_words": ["_english_"]}]}, "_english_"),
        ({"tokenizer": {"type": "icu"}}, "tokenizer 'icu'"),
    ],
    ids=str,
)
def test_what_milvus_lite_cannot_build_is_named(params, refused) -> None:
    problem = lite_analyzer_problem(params)
    assert problem is not None and refused in problem and "standard and jieba" in problem


@pytest.mark.parametrize("params", PARAMS[:-1], ids=str)
def test_what_milvus_lite_builds_passes(params) -> None:
    assert lite_analyzer_problem(params) is None


def test_punctuation_stop_words_are_words_not_a_built_in_list() -> None:
    """``_`` and ``__`` are tokens jieba makes of identifiers (``before_request``); only ``_name_`` names a list."""
    params = {"tokenizer": "jieba", "filter": [{"type": "stop", "stop_words": ["_", "__", ".", "(", ")"]}]}
    assert lite_analyzer_problem(params) is None
    assert analyzer_tokenizer(params)("app.before_request(view)") == ["app", "before", "request", "view"]


def test_an_analyzer_lite_cannot_build_fails_at_collection_creation_in_one_line(
    milvus_target: MilvusTarget, tmp_path: Path
) -> None:
    """On a Lite file and a ``milvus-lite server``; a real Milvus server builds the english analyzer."""
    settings = milvus_target.settings(tmp_path).model_copy(update={"analyzer": {"type": "english"}})
    on_lite = not milvus_target.on_server or MILVUS_SERVER_RUN["version"].startswith("milvus_lite")
    if not on_lite:
        index = LeafIndex(settings, encoder_name="fake", dim=8)
        assert not index.on_lite
        index.close()
        return
    with pytest.raises(UnsupportedAnalyzer) as caught:
        LeafIndex(settings, encoder_name="fake", dim=8)
    message = str(caught.value)
    assert "\n" not in message and "Milvus Lite supports only the standard and jieba tokenizers" in message
    assert message.startswith("STRATA_MILVUS__ANALYZER: ")
