"""The BM25 analyzer's tokens computed here are the tokens Milvus Lite's own analyzer yields."""

from __future__ import annotations

import pytest
from milvus_lite.analyzer.factory import create_analyzer

from strata.stores.analyzer import UnsupportedAnalyzer, analyzer_tokenizer, is_punctuation
from strata.stores.leaf_schema import analyzer_with_dictionary

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
def test_tokens_match_milvus_lite(params) -> None:  # noqa: ANN001
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
