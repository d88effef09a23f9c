"""Synonym dictionary: loading YAML/TOML and expanding the BM25 text of a query."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.config import ConfigError
from strata.rag.expansion import SynonymDictionary, expand, load_synonyms

YAML = """
Token管理: [Token, JWT, AccessToken]
两步验证: [2FA, two-factor authentication]
"""


@pytest.fixture
def dictionary(tmp_path: Path) -> SynonymDictionary:
    path = tmp_path / "synonyms.yaml"
    path.write_text(YAML, encoding="utf-8")
    return load_synonyms(path)


def test_a_term_in_the_query_adds_its_synonyms(dictionary: SynonymDictionary) -> None:
    text, added = expand("Token管理怎么配置？", dictionary)
    assert added == ("JWT", "AccessToken")  # "Token" already occurs inside "Token管理"
    assert text == "Token管理怎么配置？ JWT AccessToken"


def test_a_synonym_in_the_query_adds_the_head_term_and_the_others(dictionary: SynonymDictionary) -> None:
    text, added = expand("how do I enable 2fa", dictionary)
    assert added == ("两步验证", "two-factor authentication")
    assert text.startswith("how do I enable 2fa ")


def test_ascii_terms_match_whole_words_only(dictionary: SynonymDictionary) -> None:
    assert expand("JWTS are not JWT-less tokens", dictionary)[1] != ()  # "JWT" occurs as a word
    assert expand("the JWTS list", dictionary) == ("the JWTS list", ())
    assert expand("nothing to expand here", dictionary) == ("nothing to expand here", ())


def test_group_of_finds_the_whole_group_ignoring_case(dictionary: SynonymDictionary) -> None:
    assert dictionary.group_of("jwt") == ("jwt", "Token管理", "Token", "AccessToken")
    assert dictionary.group_of("unknown") == ("unknown",)


def test_toml_files_load_the_same(tmp_path: Path) -> None:
    path = tmp_path / "synonyms.toml"
    path.write_text('"Token管理" = ["Token", "JWT"]\nbackup = "snapshot"\n', encoding="utf-8")
    loaded = load_synonyms(path)
    assert loaded.groups == (("Token管理", "Token", "JWT"), ("backup", "snapshot"))
    assert expand("nightly backup", loaded) == ("nightly backup snapshot", ("snapshot",))


def test_no_file_means_no_expansion() -> None:
    empty = load_synonyms(None)
    assert not empty and expand("Token管理", empty) == ("Token管理", ())


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("- a\n- b\n", ".yaml", "must map terms"),
        ("a: [1, 2]\n", ".yaml", "list of strings"),
        ("a = [", ".toml", "not valid"),
    ],
)
def test_bad_files_name_the_setting(tmp_path: Path, content: str, suffix: str, message: str) -> None:
    path = tmp_path / f"synonyms{suffix}"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=f"STRATA_RETRIEVAL__SYNONYMS.*{message}"):
        load_synonyms(path)
