"""The filter builder: escaping proven against Milvus Lite's own parser and data."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymilvus import DataType, MilvusClient

from strata.stores import filters as F
from strata.types import Filters

pytestmark = pytest.mark.integration  # stores opened in the tests' bodies

INJECTIONS = [
    '" or kb_id != "',
    '\\" or 1 == 1 or \\"',
    "') or (1 == 1",
    '"; drop collection leaves; "',
    "a\nb",
    "back\\slash\\",
    "tab\tand\rreturn",
    "' or doc_id like '%",
    '文档 "引号" ＼',
    "%",
    "_",
]

_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> MilvusClient:
    path = Path(tmp_path_factory.mktemp("filters")) / "f.db"
    client = MilvusClient(str(path))
    schema = MilvusClient.create_schema(auto_id=False)
    schema.add_field("pk", DataType.INT64, is_primary=True)
    schema.add_field("kb_id", DataType.VARCHAR, max_length=64)
    schema.add_field("doc_id", DataType.VARCHAR, max_length=512)
    schema.add_field("skill_points", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=8, max_length=512)
    schema.add_field("vec", DataType.FLOAT_VECTOR, dim=2)
    params = client.prepare_index_params()
    params.add_index(field_name="vec", index_type="FLAT", metric_type="IP")
    client.create_collection("rows", schema=schema, index_params=params)
    decoys = [
        {"pk": i, "kb_id": "b", "doc_id": f"decoy-{i}", "skill_points": ["x"], "vec": [1.0, 0.0]} for i in range(5)
    ]
    client.insert("rows", decoys)
    client.load_collection("rows")
    return client


_pks = itertools.count(1000)


def _insert(client: MilvusClient, value: str) -> int:
    pk = next(_pks)
    client.insert("rows", [{"pk": pk, "kb_id": "a", "doc_id": value, "skill_points": [value], "vec": [0.0, 1.0]}])
    return pk


def _matching(client: MilvusClient, where: str) -> set[int]:
    return {row["pk"] for row in client.query("rows", filter=where, output_fields=["pk"])}


@pytest.mark.parametrize("payload", INJECTIONS)
def test_injection_payloads_match_only_their_own_row(client: MilvusClient, payload: str) -> None:
    pk = _insert(client, payload)
    assert _matching(client, F.eq("doc_id", payload)) == {pk}
    assert _matching(client, F.all_of(F.eq("kb_id", "b"), F.eq("doc_id", payload))) == set()
    assert pk in _matching(client, F.array_contains_any("skill_points", [payload]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_values)
def test_any_string_round_trips_through_the_parser(client: MilvusClient, value: str) -> None:
    pk = _insert(client, value)
    matched = _matching(client, F.eq("doc_id", value))
    assert pk in matched
    rows = client.query("rows", filter=F.eq("doc_id", value), output_fields=["doc_id"])
    assert {row["doc_id"] for row in rows} == {value}
    assert _matching(client, F.in_("doc_id", [value, "decoy-1"])) >= {pk}


def test_field_names_come_from_an_allowlist() -> None:
    with pytest.raises(ValueError, match="cannot be filtered"):
        F.eq("doc_id == '' or kb_id", "x")
    with pytest.raises(ValueError):
        F.array_contains_any("doc_id", ["x"])
    with pytest.raises(TypeError):
        F.eq("version", "1 or 1==1")


def test_nul_and_empty_lists_are_refused() -> None:
    with pytest.raises(ValueError):
        F.quote("a\x00b")
    with pytest.raises(ValueError):
        F.in_("doc_id", [])


def test_filters_expression_combines_every_field() -> None:
    where = F.filters_expression(
        Filters(modules=("auth",), skill_points=("2fa",), doc_ids=("a.md",), source_prefix="guides/")
    )
    assert where == (
        '(module in ["auth"]) and (array_contains_any(skill_points, ["2fa"])) and '
        '(doc_id in ["a.md"]) and (source like "guides/%")'
    )
    assert F.filters_expression(Filters()) == ""
    assert F.needs_exact_check("user_guide/") and not F.needs_exact_check("guides/")
