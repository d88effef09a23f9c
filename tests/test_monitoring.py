"""deploy/monitoring: the alert rules pass promtool (syntax and their unit tests), the PrometheusRule holds the
same groups, and every metric the rules and the Grafana dashboard name is one a real ``/metrics`` scrape
of the service exports.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import redis
import yaml
from fastapi.testclient import TestClient
from milvus_lite.server_manager import server_manager_instance
from prometheus_client.parser import text_string_to_metric_families

from strata.api import create_app
from strata.indexing.pipeline import Indexer
from strata.resources import Resources
from tests.support.documents import GARDEN_DOC
from tests.support.processes import free_port
from tests.support.stores import REDIS_URL, make_settings

REPO = Path(__file__).resolve().parents[1]
MONITORING = REPO / "deploy" / "monitoring"
ALERTS, ALERT_TESTS = MONITORING / "alerts.yaml", MONITORING / "alerts-test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
PROMETHEUS_RULE = REPO / "deploy" / "k8s" / "prometheusrule.yaml"
PROMETHEUS_OWN = frozenset({"up"})  # series Prometheus writes itself for every target

# PromQL words that are not metric names (functions and aggregations are told apart by the "(" or "by" after them)
KEYWORDS = frozenset(
    {
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "atan2",
        "inf",
        "nan",
        "start",
        "end",
    }
)
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_TOKEN = re.compile(
    r"""(?P<skip>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`"""  # strings
    r"""|\{(?:"(?:[^"\\]|\\.)*"|[^}"])*\}"""  # label matchers (label names and values)
    r"""|\[[^\]]*\]"""  # ranges and subqueries ([5m], [$__rate_interval])
    r"""|\d[\w.]*(?:[eE][+-]?\d+)?)"""  # numbers and durations
    r"""|(?P<name>[A-Za-z_:][\w:]*)|(?P<other>\S)"""
)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: identifiers that are not a function, an aggregation, a
    keyword or a label of a ``by (...)``/``on (...)`` list, outside strings, matchers and ranges."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expr) if m.lastgroup != "skip"]
    names: set[str] = set()
    depth, depth_of_label_list = 0, None  # the depth of the "(" of a label list being skipped
    for i, (kind, text) in enumerate(tokens):
        following = tokens[i + 1][1] if i + 1 < len(tokens) else ""
        if text == "(":
            depth += 1
        elif text == ")":
            depth -= 1
            if depth_of_label_list is not None and depth < depth_of_label_list:
                depth_of_label_list = None
        elif kind == "name" and depth_of_label_list is None:
            if text in LABEL_LISTS and following == "(":
                depth_of_label_list = depth + 1
            elif following not in {"(", "by", "without"} and text.lower() not in KEYWORDS:  # sum by (x) (...)
                names.add(text)
    return names


class Scrape(NamedTuple):
    samples: set[str]  # the sample names of the scrape
    declared: set[str]  # the names its ``# TYPE`` lines declare: a labelled family has no sample until first counted


SAMPLE_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def _label_values_selector(query: str) -> str:
    """A Grafana ``label_values(selector, label)`` variable query: its selector (the label is no metric)."""
    found = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S)
    return found.group(1) if found else query


def dashboard_expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(where, expression)`` for every panel target (rows' panels included) and every query variable."""
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
            yield f"variable {variable['name']}", _label_values_selector(query)


def rule_expressions(rules_file: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for group in rules_file["groups"]:
        for rule in group["rules"]:
            yield f"rule {rule.get('alert') or rule.get('record')}", rule["expr"]


def unknown_names(expressions: Iterable[tuple[str, str]], exported: set[str]) -> dict[str, set[str]]:
    """Where an expression names a metric that is neither exported nor Prometheus's own, and which."""
    found = {where: metric_names(expr) - exported - PROMETHEUS_OWN for where, expr in expressions}
    return {where: names for where, names in found.items() if names}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    if os.environ.get("CI"):
        pytest.fail("promtool is missing: CI must install Debian's prometheus package (.ci/run: install_promtool)")
    pytest.skip("promtool is not installed (apt-get install prometheus: Debian's prometheus package ships it)")


def _run_promtool(*args: str) -> None:
    done = subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alert_rules_are_valid() -> None:
    _run_promtool("check", "rules", str(ALERTS.relative_to(REPO)))


def test_each_alert_fires_on_its_condition_and_stays_silent_without_it() -> None:
    _run_promtool("test", "rules", str(ALERT_TESTS.relative_to(REPO)))
    alerts = {rule["alert"] for _, rule in _rules()}
    cases = [case for test in _yaml(ALERT_TESTS)["tests"] for case in test["alert_rule_test"]]
    assert {c["alertname"] for c in cases if c["exp_alerts"]} == alerts  # every alert has a case where it fires
    assert {c["alertname"] for c in cases if not c["exp_alerts"]} == alerts  # ... and one where it must not


def test_every_alert_says_how_bad_it_is_and_where_its_runbook_is() -> None:
    runbook = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "## Alerts and dashboard" in runbook
    for _, rule in _rules():
        assert rule["for"] and rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert f'"Alerts and dashboard", {rule["alert"]}' in rule["annotations"]["description"], rule["alert"]
        assert f"**{rule['alert']}**" in runbook, f"docs/deploy.md has no runbook entry for {rule['alert']}"


def test_the_prometheus_rule_holds_the_same_groups_as_alerts_yaml() -> None:
    (manifest,) = [d for d in yaml.safe_load_all(PROMETHEUS_RULE.read_text(encoding="utf-8")) if d]
    assert manifest["kind"] == "PrometheusRule" and manifest["metadata"]["namespace"] == "strata"
    assert manifest["spec"]["groups"] == _yaml(ALERTS)["groups"]


def test_the_name_check_reports_a_metric_the_service_does_not_export() -> None:
    expr = (
        'sum by (le, route) (rate(strata_no_such_metric_total{route=~"/retrieve.*", le!="x"}[5m])) '
        "/ on (route) group_left (instance) sum without (job) (strata_http_requests_total offset 1h) > bool 0.5e3"
    )
    assert metric_names(expr) == {"strata_no_such_metric_total", "strata_http_requests_total"}
    exported = {"strata_http_requests_total"}
    assert unknown_names([("made up", expr)], exported) == {"made up": {"strata_no_such_metric_total"}}
    assert metric_names(
        'histogram_quantile(0.95, sum(rate(x_bucket[$__rate_interval])) by (le)) or up{job="s"} == 0'
    ) == {
        "x_bucket",
        "up",
    }
    panel = {
        "panels": [
            {
                "type": "row",
                "title": "r",
                "panels": [{"title": "p", "targets": [{"refId": "A", "expr": "rate(strata_typo_total[5m])"}]}],
            }
        ],
        "templating": {
            "list": [{"type": "query", "name": "job", "query": {"query": "label_values(strata_typo2, job)"}}]
        },
    }
    assert unknown_names(dashboard_expressions(panel), exported) == {
        "panel 'p' A": {"strata_typo_total"},
        "variable job": {"strata_typo2"},
    }


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, memo_encoder: Any) -> Iterator[Scrape]:
    """A real ``/metrics`` scrape after retrievals (one degraded by a reranker that refuses connections), a
    cache hit, an oversized body and a readiness probe."""
    root = tmp_path_factory.mktemp("monitoring")
    source = root / "garden"
    source.mkdir()
    (source / "handbook.md").write_text(GARDEN_DOC, encoding="utf-8")
    redis_prefix = f"strata-test-{uuid.uuid4().hex[:10]}"
    settings = make_settings(
        root,
        module_pg_url,
        redis_prefix=redis_prefix,
        query_cache=True,
        api={"max_upload_bytes": 4096},
        rerank={"url": f"http://127.0.0.1:{free_port()}/rerank", "max_retries": 0, "connect_timeout_s": 1.0},
    )
    resources = Resources(settings, encoder=memo_encoder)
    try:
        assert Indexer(resources).index_paths([source], kb_id="monitoring").failed == 0
        with TestClient(create_app(settings, resources=resources), raise_server_exceptions=False) as client:
            text = _exercise(client)
    finally:
        resources.close()
        server_manager_instance.release_server(str(settings.milvus.uri))
        _drop_keys(redis_prefix)
    families = list(text_string_to_metric_families(text))
    yield Scrape(
        samples={sample.name for family in families for sample in family.samples},
        declared={family.name + suffix for family in families for suffix in SAMPLE_SUFFIXES.get(family.type, ())},
    )


def _drop_keys(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _exercise(client: TestClient) -> str:
    query = {"query": "how often to water tomatoes", "top_k": 2, "kb_ids": ["monitoring"], "rerank": False}
    assert client.post("/retrieve", json=query).json()["meta"]["cache"] == "miss"
    assert client.post("/retrieve", json=query).json()["meta"]["cache"] == "hit"
    degraded = client.post("/retrieve", json={**query, "rerank": True}).json()["meta"]
    assert degraded["status"] == "degraded" and "rerank_failed" in degraded["degraded"], degraded
    assert (
        client.post("/retrieve", content=b"x" * 5000, headers={"Content-Type": "application/json"}).status_code == 413
    )
    client.get("/ready")  # its answer is tests/api/test_readiness.py's business; here it makes the /ready series
    scraped = client.get("/metrics")
    assert scraped.status_code == 200, scraped.text
    return scraped.text


def test_every_metric_the_dashboard_and_the_rules_name_is_exported(scrape: Scrape) -> None:
    # the requests reached every labelled family the alerts read: these are samples, not only declarations
    assert {
        "strata_retrievals_total",
        "strata_retrieval_degraded_total",
        "strata_http_requests_rejected_total",
        "strata_http_request_duration_seconds_bucket",
        "strata_http_requests_total",
        "strata_query_cache_total",
    } <= scrape.samples
    exported = scrape.samples | scrape.declared
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    used = list(dashboard_expressions(dashboard)) + list(rule_expressions(_yaml(ALERTS)))
    assert len(used) > 20 and all(metric_names(expr) for _, expr in used)  # every expression was read
    assert unknown_names(used, exported) == {}


def test_the_dashboard_reads_every_metric_family_and_one_templated_data_source(scrape: Scrape) -> None:
    exported = scrape.samples | scrape.declared
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    read = set().union(*(metric_names(expr) for _, expr in dashboard_expressions(dashboard)))
    read_by_suffix = ("_created", "_count", "_sum")  # a histogram is read through its buckets
    families = {
        n.removesuffix("_bucket") for n in exported if n.startswith("strata_") and not n.endswith(read_by_suffix)
    }
    assert {name.removesuffix("_bucket") for name in read} >= families
    assert [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "datasource"] == ["prometheus"]
    sources = {json.dumps(p["datasource"]) for p in _panels(dashboard)} | {
        json.dumps(t["datasource"]) for p in _panels(dashboard) for t in p.get("targets", [])
    }
    assert sources == {json.dumps({"type": "prometheus", "uid": "${datasource}"})}


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _rules() -> Iterator[tuple[str, dict[str, Any]]]:
    for group in _yaml(ALERTS)["groups"]:
        for rule in group["rules"]:
            yield group["name"], rule


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))
