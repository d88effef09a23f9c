// strata retrieval console: plain DOM, no framework, no external resource.
// Every figure shown comes from the service's answers (the meta record, /kbs, the index report);
// text is always inserted as text (textContent / text nodes), never as HTML.
"use strict";

const KEY_STORAGE = "strata.apiKey";
const STATUS_WORDS = {
  ok: "OK: every stage ran as planned.",
  degraded: "Degraded: the evidence is usable, but a stage fell back (reasons below).",
  failed: "Failed: no evidence could be retrieved. This is an outage, not an empty knowledge base.",
};
const MODE_WORDS = {
  hybrid: "dense (embedding) and BM25 (keyword) search, fused by RRF",
  dense: "dense (embedding) search only",
  sparse: "BM25 (keyword) search only",
  dense_fallback: "dense search only, because the hybrid search failed",
  sparse_fallback: "BM25 search only, because the query encoder failed",
  failed: "no search succeeded",
};
const REASON_WORDS = {
  hybrid_search_failed: "the hybrid search failed; dense search was retried alone",
  query_encoder_failed: "the query could not be embedded; BM25 search only",
  rerank_failed: "the reranker failed; the fused order was kept",
  parent_fetch_failed: "parent chunks could not be fetched; leaves were kept",
  parent_missing: "some parent chunks were not found; their leaves were kept",
  unserved_leaves: "the search found leaves SQL does not serve (orphans for strata reconcile --repair); they were left out",
  leaves_missing: "the Milvus collection holds none of the leaves these knowledge bases serve (another Milvus or collection?)",
  parent_cache_unavailable: "the parent cache (Redis) was unreachable; SQL answered instead",
  serving_state_unavailable: "the serving state could not be read from SQL",
  serving_state_stale: "SQL was unreachable; the last serving state this process saw was used",
};
const TRACE_FIELDS = [
  ["dense_rank", "dense rank"], ["dense_score", "dense score"],
  ["sparse_rank", "BM25 rank"], ["sparse_score", "BM25 score"],
  ["fused_score", "fused (RRF)"], ["rerank_score", "rerank score"], ["score_stage", "score from"],
];

// the strategies come from the service (GET /ui/strategies, strata.strategy_table): name -> {summary, merge, ...}
const state = { key: sessionStorage.getItem(KEY_STORAGE) || "", keysRequired: false, kbs: [], strategies: new Map(), compare: [] };
const $ = (id) => document.getElementById(id);

// -- DOM and API helpers -----------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "style") Object.assign(node.style, value);
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(node, visible) { node.hidden = !visible; }
function fail(node, message) { node.textContent = message || ""; show(node, Boolean(message)); }
function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "–";
  return typeof value === "number" && !Number.isInteger(value) ? value.toFixed(digits) : String(value);
}

// a score is a float even when it is a whole number (1 = ranked first by every route)
const fmtScore = (value) => (typeof value === "number" ? value.toFixed(4) : fmt(value));

const pairs = (object, prefix = "") => Object.entries(object).map(([k, v]) => `${prefix}${k} ${v}`).join(", ");
const headRow = (names) => el("thead", {}, el("tr", {}, names.map((name) => el("th", {}, name))));

class Unreachable extends Error {}

class ApiError extends Error {
  constructor(status, title, detail, body) {
    super(`${status} ${title}: ${detail}`);
    Object.assign(this, { status, title, detail, body });
  }
}

async function api(method, path, body, { key = state.key } = {}) {
  const headers = {};
  if (key) headers.Authorization = `Bearer ${key}`;
  const init = { method, headers };
  if (body instanceof FormData) init.body = body;
  else if (body !== undefined) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(body); }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    throw new Unreachable(error.message);
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch (_) { data = null; }
  if (!response.ok) {
    const detail = data && (typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail)) || text;
    throw new ApiError(response.status, (data && data.title) || response.statusText, detail, data);
  }
  return data;
}

function explain(error) {
  if (error instanceof Unreachable) return `The service could not be reached: ${error.message}`;
  if (!(error instanceof ApiError)) return `The console failed: ${error.message}`;
  if (error.status === 401) return "The service did not accept the API key (401 Unauthorized). Enter a valid key.";
  return `${error.status} ${error.title}: ${error.detail}`;
}

function handleAuthLoss(error) {
  if (error instanceof ApiError && error.status === 401) {
    sessionStorage.removeItem(KEY_STORAGE);
    state.key = "";
    askForKey(state.keysRequired ? "The key was refused (401 Unauthorized): enter a valid key." : "");
    return true;
  }
  return false;
}

// -- start, key, tabs ------------------------------------------------------------

async function loadStrategies() {
  const table = await api("GET", "/ui/strategies");
  state.strategies = new Map(table.strategies.map((s) => [s.name, s]));
  state.compare = table.compare;
}

async function boot() {
  try {
    await loadStrategies();
  } catch (error) {
    fail($("banner"), explain(error));
    return;
  }
  fillOptions();
  $("key-form").addEventListener("submit", onKey);
  $("query-form").addEventListener("submit", (e) => { e.preventDefault(); runQuery(); });
  $("compare-form").addEventListener("submit", (e) => { e.preventDefault(); runCompare(); });
  $("upload-form").addEventListener("submit", (e) => { e.preventDefault(); runUpload(); });
  for (const tab of document.querySelectorAll(".tab")) tab.addEventListener("click", () => switchView(tab.dataset.view));
  try {
    await loadKbs();
  } catch (error) {
    if (error instanceof ApiError && error.status === 401) {
      state.keysRequired = true;
      const had = Boolean(state.key);
      sessionStorage.removeItem(KEY_STORAGE);
      state.key = "";
      askForKey(had ? "The stored key was refused (401 Unauthorized): enter a valid key." : "");
      return;
    }
    fail($("banner"), explain(error));
    return;
  }
  ready();
}

function askForKey(message) {
  for (const id of ["query-view", "compare-view", "kbs-view", "tabs"]) show($(id), false);
  $("who").replaceChildren();
  show($("key-view"), true);
  fail($("key-error"), message);
  $("key-input").value = "";
  $("key-input").focus();
}

async function onKey(event) {
  event.preventDefault();
  const key = $("key-input").value.trim();
  try {
    state.kbs = (await api("GET", "/kbs", undefined, { key })).kbs;
  } catch (error) {
    fail($("key-error"), error instanceof ApiError && error.status === 401
      ? "This key was not accepted by the service (401 Unauthorized). Check it and try again."
      : explain(error));
    return;
  }
  state.key = key;
  state.keysRequired = true;
  sessionStorage.setItem(KEY_STORAGE, key);
  ready();
}

async function loadKbs() {
  const data = await api("GET", "/kbs");
  state.kbs = data.kbs;
  if (!state.key) state.keysRequired = false;
  else state.keysRequired = true;
}

function ready() {
  show($("key-view"), false);
  fail($("key-error"), "");
  show($("tabs"), true);
  renderWho();
  fillKbSelects();
  renderKbTable();
  const params = new URLSearchParams(location.search);
  const view = params.get("view") || "query";
  switchView(view);
  if (params.get("q") && view === "compare") {
    applyCompareParams(params);
    runCompare();
  } else if (params.get("q")) {
    applyParams(params);
    runQuery();
  }
}

function renderWho() {
  const who = $("who");
  if (!state.keysRequired) {
    who.replaceChildren(el("span", { class: "muted" }, "open service (no API keys)"));
    return;
  }
  const forget = el("button", { type: "button", id: "forget-key", onclick: () => {
    sessionStorage.removeItem(KEY_STORAGE);
    state.key = "";
    askForKey("");
  } }, "Forget key");
  const count = `${state.kbs.length} kb${state.kbs.length === 1 ? "" : "s"}`;
  who.replaceChildren(el("span", { class: "muted" }, `key in use (${count})`), forget);
}

function switchView(view) {
  if (!["query", "compare", "kbs"].includes(view)) view = "query";
  for (const name of ["query", "compare", "kbs"]) {
    show($(`${name}-view`), name === view);
    $(`tab-${name}`).classList.toggle("active", name === view);
  }
}

function fillOptions() {
  for (const id of ["strategy", "a-strategy", "b-strategy"]) {
    $(id).replaceChildren(el("option", { value: "" }, "service default"),
      ...[...state.strategies.keys()].map((s) => el("option", { value: s }, s)));
  }
  for (const id of ["rerank", "a-rerank", "b-rerank"]) {
    $(id).replaceChildren(el("option", { value: "" }, "as configured"),
      el("option", { value: "on" }, "on"), el("option", { value: "off" }, "off"));
  }
  [$("a-strategy").value, $("b-strategy").value] = state.compare;
}

function fillKbSelects() {
  for (const id of ["kb", "ckb"]) {
    const select = $(id);
    const current = select.value;
    select.replaceChildren(el("option", { value: "" }, "all my knowledge bases"),
      ...state.kbs.map((kb) => el("option", { value: kb.kb_id }, kb.kb_id)));
    if (state.kbs.some((kb) => kb.kb_id === current)) select.value = current;
  }
}

// -- query ---------------------------------------------------------------------------

const list = (text) => text.split(",").map((s) => s.trim()).filter(Boolean);

function readQueryForm() {
  return {
    q: $("q").value.trim(), kb: $("kb").value, k: Number($("k").value) || 5,
    strategy: $("strategy").value, rerank: $("rerank").value, expand: $("expand").checked,
    modules: $("modules").value.trim(), skills: $("skills").value.trim(),
    source_prefix: $("source_prefix").value.trim(), doc_ids: $("doc_ids").value.trim(),
    variants: $("variants").value.split("\n").map((s) => s.trim()).filter(Boolean),
  };
}

function requestBody(o) {
  const body = { query: o.q, top_k: o.k, explain: true, expand: o.expand };
  if (o.kb) body.kb_ids = [o.kb];
  if (o.strategy) body.strategy = o.strategy;
  if (o.rerank) body.rerank = o.rerank === "on";
  const filters = {};
  if (o.modules) filters.modules = list(o.modules);
  if (o.skills) filters.skill_points = list(o.skills);
  if (o.doc_ids) filters.doc_ids = list(o.doc_ids);
  if (o.source_prefix) filters.source_prefix = o.source_prefix;
  if (Object.keys(filters).length) body.filters = filters;
  if (o.variants && o.variants.length) body.queries = o.variants;
  return body;
}

function permalink(o) {
  const params = new URLSearchParams({ q: o.q });
  if (o.kb) params.set("kb", o.kb);
  params.set("k", String(o.k));
  if (o.strategy) params.set("strategy", o.strategy);
  if (o.rerank) params.set("rerank", o.rerank);
  if (!o.expand) params.set("expand", "0");
  for (const name of ["modules", "skills", "source_prefix", "doc_ids"]) if (o[name]) params.set(name, o[name]);
  for (const v of o.variants) params.append("variant", v);
  return `/ui?${params}`;
}

function selectKb(id, kb) {
  if (kb && !state.kbs.some((k) => k.kb_id === kb)) {  // kept, so the answer (a 404) says why
    $(id).append(el("option", { value: kb }, `${kb} (not among this key's kbs)`));
  }
  $(id).value = kb;
}

function applyParams(params) {
  $("q").value = params.get("q") || "";
  selectKb("kb", params.get("kb") || "");
  $("k").value = params.get("k") || "5";
  const strategy = params.get("strategy") || "";
  $("strategy").value = state.strategies.has(strategy) ? strategy : "";
  $("rerank").value = ["on", "off"].includes(params.get("rerank")) ? params.get("rerank") : "";
  $("expand").checked = params.get("expand") !== "0";
  for (const name of ["modules", "skills", "source_prefix", "doc_ids"]) $(name).value = params.get(name) || "";
  $("variants").value = params.getAll("variant").join("\n");
}

async function runQuery() {
  const options = readQueryForm();
  if (!options.q) return;
  const link = permalink(options);
  history.replaceState(null, "", link);
  $("permalink").href = link;
  show($("permalink"), true);
  fail($("query-error"), "");
  const out = $("query-out");
  out.replaceChildren(el("p", { class: "muted" }, "retrieving…"));
  $("run").disabled = true;
  try {
    const result = await api("POST", "/retrieve", requestBody(options));
    out.replaceChildren(renderResult(result, options.q));
  } catch (error) {
    out.replaceChildren();
    if (handleAuthLoss(error)) return;
    fail($("query-error"), explain(error));
    if (error.body && error.body.meta) out.replaceChildren(renderMeta(error.body.meta));
  } finally {
    $("run").disabled = false;
  }
}

function renderResult(result, query) {
  const terms = highlightTerms(query, result.meta);
  return el("div", { class: "result" },
    renderMeta(result.meta),
    renderMergeTree(result.docs, result.meta),
    el("h2", {}, `Evidence (${result.docs.length})`),
    result.docs.length ? null : el("p", { class: "muted", id: "no-docs" },
      "No evidence matched (the retrieval itself succeeded: see the status above)."),
    el("ol", { class: "cards", id: "cards" }, result.docs.map((doc, i) => renderCard(doc, i + 1, terms))));
}

// -- meta record ---------------------------------------------------------------------

function renderMeta(meta) {
  const status = meta.status || "unknown";
  const facts = [
    ["mode", meta.mode ? `${meta.mode}: ${MODE_WORDS[meta.mode] || meta.mode}` : null],
    ["strategy", meta.strategy ? `${meta.strategy}: ${state.strategies.get(meta.strategy)?.summary || ""}` : null],
    ["knowledge bases", meta.kb_ids ? meta.kb_ids.join(", ") : "all"],
    ["returned", meta.returned !== undefined
      ? `${meta.returned} of top_k ${meta.top_k} (candidate_k ${meta.candidate_k})` : null],
    ["candidates", meta.fused_candidates !== undefined
      ? `dense ${meta.dense_candidates}, BM25 ${meta.sparse_candidates}, fused ${meta.fused_candidates}` : null],
    ["dropped by min score", meta.dropped_by_min_score || null],
    ["rerank", meta.rerank ? rerankWords(meta.rerank) : null],
    ["query cache", meta.cache],
    ["parent cache", meta.parent_cache && Object.keys(meta.parent_cache).length
      ? Object.entries(meta.parent_cache).map(([k, v]) => `${k} ${v}`).join(", ") : null],
    ["query variants", meta.query_variants && meta.query_variants.length ? meta.query_variants.join(" | ") : null],
    ["synonym expansion", meta.expansion && meta.expansion.added_terms && meta.expansion.added_terms.length
      ? `BM25 also searched: ${meta.expansion.added_terms.join(", ")}` : null],
    ["filters", meta.filters && Object.keys(meta.filters).length ? JSON.stringify(meta.filters) : null],
  ].filter(([, v]) => v !== null && v !== undefined && v !== "");
  return el("section", { class: "panel meta", id: "meta" },
    el("h2", {}, "Meta record"),
    el("p", { class: `status status-${status}`, id: "meta-status" },
      el("strong", {}, status), " ", STATUS_WORDS[status] || ""),
    el("dl", { class: "facts" }, facts.map(([k, v]) => [el("dt", {}, k), el("dd", {}, String(v))])),
    (meta.degraded || []).length ? el("div", { id: "meta-degraded" }, el("h3", {}, "Degraded because"),
      el("ul", {}, meta.degraded.map((code) => el("li", {}, el("code", {}, code), " ", REASON_WORDS[code] || "")))) : null,
    (meta.errors || []).length ? el("div", { id: "meta-errors" }, el("h3", {}, "Errors"),
      el("ul", {}, meta.errors.map((e) => el("li", {}, el("code", {}, e.stage), ` ${e.error}: ${e.message}`)))) : null,
    renderTimings(meta.timings_ms || {}));
}

function rerankWords(rerank) {
  const parts = [rerank.status];
  if (rerank.reason) parts.push(`(${rerank.reason})`);
  if (rerank.provider) parts.push(`by ${rerank.provider}`);
  if (rerank.latency_ms !== null && rerank.latency_ms !== undefined) parts.push(`in ${fmt(rerank.latency_ms, 1)} ms`);
  return parts.join(" ");
}

function renderTimings(timings) {
  const stages = Object.entries(timings).filter(([name]) => name !== "total");
  if (!stages.length) return null;
  const sum = stages.reduce((acc, [, ms]) => acc + ms, 0) || 1;
  const total = timings.total;
  return el("div", { class: "timings" },
    el("h3", {}, `Stage timings${total !== undefined ? ` (total ${fmt(total, 1)} ms)` : ""}`),
    el("div", { class: "bar", id: "timing-bar" }, stages.map(([name, ms], i) =>
      el("span", { class: `seg seg-${i % 6}`, title: `${name}: ${fmt(ms, 1)} ms`, "data-stage": name,
        style: { flexGrow: String(Math.max(ms / sum, 0.001)) } }, `${name} ${fmt(ms, 1)}`))),
    el("ul", { class: "legend" }, stages.map(([name, ms], i) =>
      el("li", {}, el("i", { class: `dot seg-${i % 6}` }), `${name} ${fmt(ms, 1)} ms`))));
}

// -- merge tree ----------------------------------------------------------------------

function renderMergeTree(docs, meta) {
  const merged = docs.map((doc, i) => ({ doc, rank: i + 1 })).filter(({ doc }) => (doc.metadata.merged_from || []).length);
  const rounds = meta.merge_rounds || [];
  const groups = new Map();
  for (const item of merged) {
    const level = item.doc.metadata.level;
    const label = state.strategies.get(meta.strategy)?.merge === "adjacent" || level === 3
      ? "adjacent leaves joined into one passage"
      : `chunks merged into their L${level} parent`;
    if (!groups.has(label)) groups.set(label, []);
    groups.get(label).push(item);
  }
  const sorted = [...groups.entries()].sort(([a], [b]) => b.localeCompare(a));  // L2 parents, then L1
  return el("section", { class: "panel", id: "merge-tree" },
    el("h2", {}, "Merge tree"),
    rounds.length ? el("ul", { class: "rounds" }, rounds.map((r) => el("li", {},
      `round ${r.round}: ${r.parents_merged} parent(s) merged, ${r.children_replaced} child(ren) replaced`
      + (r.parents_missing ? `, ${r.parents_missing} parent(s) missing` : "")))) : null,
    merged.length ? sorted.map(([label, items]) => el("div", { class: "merge-group" }, el("h3", {}, label),
      el("ul", { class: "tree" }, items.map(mergeNode))))
      : el("p", { class: "muted" }, rounds.some((r) => r.parents_merged)
        ? "Parents were merged but none reached the returned evidence."
        : "Nothing was merged: every piece of evidence is a chunk as it was found."));
}

function mergeNode({ doc, rank }) {
  const m = doc.metadata;
  return el("li", { class: "merge-node", "data-chunk-id": m.chunk_id },
    el("span", { class: `level l${m.level}` }, `L${m.level}`), " ", el("strong", {}, `#${rank} `),
    m.heading_path || m.source || "", " ", el("code", {}, m.chunk_id),
    el("ul", {}, m.merged_from.map((id) => el("li", { class: "merge-child" }, "← ", el("code", {}, id)))));
}

// -- cards ---------------------------------------------------------------------------

function highlightTerms(query, meta) {
  const terms = new Set();
  const added = (meta.expansion && meta.expansion.added_terms) || [];
  for (const word of [query, ...added].join(" ").split(/[\s\p{P}\p{S}]+/u)) {
    if (!word) continue;
    const cjk = word.match(/[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]+/gu) || [];
    for (const run of cjk) {
      if (run.length === 1) terms.add(run);
      for (let i = 0; i + 1 < run.length; i++) terms.add(run.slice(i, i + 2));
    }
    for (const latin of word.split(/[\p{Script=Han}\p{Script=Hiragana}\p{Script=Katakana}\p{Script=Hangul}]+/u)) {
      if (latin.length >= 2) terms.add(latin.toLowerCase());
    }
  }
  return [...terms].sort((a, b) => b.length - a.length);
}

function highlighted(text, terms) {
  const node = el("div", { class: "text" });
  if (!terms.length) { node.textContent = text; return node; }
  const escaped = terms.map((t) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  const pattern = new RegExp(`(${escaped.join("|")})`, "giu");
  let last = 0;
  for (const match of text.matchAll(pattern)) {
    if (match.index > last) node.append(document.createTextNode(text.slice(last, match.index)));
    node.append(el("mark", {}, match[0]));
    last = match.index + match[0].length;
  }
  if (last < text.length) node.append(document.createTextNode(text.slice(last)));
  return node;
}

function renderCard(doc, rank, terms) {
  const m = doc.metadata;
  const trace = m.trace || {};
  return el("li", { class: "card", "data-chunk-id": m.chunk_id, "data-kb": m.kb_id },
    el("div", { class: "card-head" },
      el("span", { class: "rank" }, `#${rank}`),
      el("span", { class: `level l${m.level}` }, `L${m.level}`),
      el("span", { class: "heading" }, m.heading_path || "(no heading)"),
      el("span", { class: "score", title: `score from ${trace.score_stage || "?"}` }, `score ${fmtScore(doc.score)}`)),
    el("div", { class: "card-sub" },
      el("span", { class: "source" }, m.source || m.doc_id || ""),
      m.kb_id ? el("span", {}, `kb ${m.kb_id}`) : null,
      el("code", { class: "chunk-id" }, m.chunk_id)),
    highlighted(doc.content, terms),
    el("details", { class: "trace" },
      el("summary", {}, "trace"),
      el("table", { class: "table trace-table" }, el("tbody", {},
        TRACE_FIELDS.map(([key, label]) =>
          el("tr", { "data-field": key }, el("th", {}, label), el("td", {}, key.endsWith("_score") ? fmtScore(trace[key]) : fmt(trace[key])))),
        (m.merged_from || []).length ? el("tr", { "data-field": "merged_from" }, el("th", {}, "merged from"),
          el("td", {}, `${m.merged_from.length} chunk(s): ${m.merged_from.join(", ")}`)) : null))));
}

// -- compare -------------------------------------------------------------------------

function sideOptions(side) {
  return {
    q: $("cq").value.trim(), kb: $("ckb").value, k: Number($("ck").value) || 5,
    strategy: $(`${side}-strategy`).value, rerank: $(`${side}-rerank`).value, expand: true,
    modules: "", skills: "", source_prefix: "", doc_ids: "", variants: [],
  };
}

function sideLabel(o) {
  return `strategy ${o.strategy || "default"}, rerank ${o.rerank || "as configured"}`;
}

// /ui?view=compare&q=…&kb=…&k=…&a=hybrid&b=auto_merge&a_rerank=on&b_rerank=off
function comparePermalink(a, b) {
  const params = new URLSearchParams({ view: "compare", q: a.q });
  if (a.kb) params.set("kb", a.kb);
  params.set("k", String(a.k));
  for (const [name, side] of [["a", a], ["b", b]]) {
    if (side.strategy) params.set(name, side.strategy);
    if (side.rerank) params.set(`${name}_rerank`, side.rerank);
  }
  return `/ui?${params}`;
}

function applyCompareParams(params) {
  $("cq").value = params.get("q") || "";
  selectKb("ckb", params.get("kb") || "");
  $("ck").value = params.get("k") || "5";
  for (const side of ["a", "b"]) {
    const strategy = params.get(side) || "";
    $(`${side}-strategy`).value = state.strategies.has(strategy) ? strategy : "";
    $(`${side}-rerank`).value = ["on", "off"].includes(params.get(`${side}_rerank`)) ? params.get(`${side}_rerank`) : "";
  }
}

async function runCompare() {
  const a = sideOptions("a"), b = sideOptions("b");
  if (!a.q) return;
  history.replaceState(null, "", comparePermalink(a, b));
  fail($("compare-error"), "");
  const out = $("compare-out");
  out.replaceChildren(el("p", { class: "muted" }, "retrieving both…"));
  $("compare-run").disabled = true;
  try {
    const [ra, rb] = await Promise.all([api("POST", "/retrieve", requestBody(a)), api("POST", "/retrieve", requestBody(b))]);
    out.replaceChildren(renderMoves(ra, rb), el("div", { class: "sides-out" },
      renderSide("A", a, ra), renderSide("B", b, rb)));
  } catch (error) {
    out.replaceChildren();
    if (handleAuthLoss(error)) return;
    fail($("compare-error"), explain(error));
  } finally {
    $("compare-run").disabled = false;
  }
}

function renderSide(name, options, result) {
  const meta = result.meta;
  return el("section", { class: "panel side", id: `side-${name.toLowerCase()}` },
    el("h2", {}, `${name}: ${sideLabel(options)}`),
    el("p", { class: `status status-${meta.status}` }, el("strong", {}, meta.status),
      ` · strategy ${meta.strategy} · mode ${meta.mode} · rerank ${meta.rerank ? meta.rerank.status : "?"}`
      + ` · ${fmt((meta.timings_ms || {}).total, 1)} ms`),
    (meta.degraded || []).length ? el("p", { class: "error" }, `degraded: ${meta.degraded.join(", ")}`) : null,
    el("ol", { class: "compact" }, result.docs.map((doc, i) => el("li", { "data-chunk-id": doc.metadata.chunk_id },
      el("span", { class: `level l${doc.metadata.level}` }, `L${doc.metadata.level}`), " ",
      el("strong", {}, `#${i + 1}`), ` ${doc.metadata.heading_path || doc.metadata.source} `,
      el("span", { class: "score" }, fmtScore(doc.score)), " ", el("code", {}, doc.metadata.chunk_id)))));
}

// A chunk contains another when both are of one document version and its character span covers the other's.
function contains(outer, inner) {
  const o = outer.metadata, i = inner.metadata;
  return o.chunk_id !== i.chunk_id && o.doc_id === i.doc_id && o.version === i.version && o.kb_id === i.kb_id
    && o.char_start <= i.char_start && i.char_end <= o.char_end;
}

function moveWords(id, docA, docB, ra, rb) {
  const rank = (docs, doc) => docs.indexOf(doc) + 1;
  if (docA && docB) {
    const a = rank(ra.docs, docA), b = rank(rb.docs, docB);
    return a === b ? "same rank" : a > b ? `up ${a - b}` : `down ${b - a}`;
  }
  const [doc, other, otherName] = docA ? [docA, rb.docs, "B"] : [docB, ra.docs, "A"];
  const outer = other.find((d) => contains(d, doc));
  if (outer) return `inside ${otherName}'s #${rank(other, outer)} (L${outer.metadata.level} ${outer.metadata.chunk_id})`;
  const inner = other.filter((d) => contains(doc, d)).map((d) => `#${rank(other, d)}`);
  if (inner.length) return `contains ${otherName}'s ${inner.join(", ")}`;
  return docA ? "only in A" : "only in B";
}

function renderMoves(ra, rb) {
  const byId = (docs) => new Map(docs.map((d) => [d.metadata.chunk_id, d]));
  const inA = byId(ra.docs), inB = byId(rb.docs);
  const ids = [...new Set([...inA.keys(), ...inB.keys()])];
  let changed = 0;
  const rows = ids.map((id) => {
    const docA = inA.get(id), docB = inB.get(id);
    const move = moveWords(id, docA, docB, ra, rb);
    if (move !== "same rank") changed += 1;
    return el("tr", { "data-chunk-id": id, class: docA && docB ? (move === "same rank" ? "" : "moved") : "onlyone" },
      el("td", {}, el("code", {}, id)), el("td", {}, docA ? `#${ra.docs.indexOf(docA) + 1}` : "–"),
      el("td", {}, docB ? `#${rb.docs.indexOf(docB) + 1}` : "–"), el("td", {}, move));
  });
  return el("section", { class: "panel", id: "moves" },
    el("h2", {}, `What moved (${changed} of ${ids.length} chunks)`),
    el("table", { class: "table" }, headRow(["chunk id", "rank in A", "rank in B", "change"]),
      el("tbody", {}, rows)));
}

// -- knowledge bases -----------------------------------------------------------------

function renderKbTable() {
  const body = $("kb-table").tBodies[0];
  body.replaceChildren(...state.kbs.map((kb) => el("tr", { "data-kb": kb.kb_id },
    el("td", {}, el("button", { type: "button", class: "link", onclick: () => showKb(kb.kb_id) }, kb.kb_id)),
    el("td", {}, kb.encoder), el("td", {}, kb.dim), el("td", {}, kb.generation))));
  show($("kb-empty"), state.kbs.length === 0);
  if (!$("upload-kb").value && state.kbs.length) $("upload-kb").value = state.kbs[0].kb_id;
}

async function refreshKbs() {
  try {
    await loadKbs();
  } catch (error) {
    if (handleAuthLoss(error)) return;
    throw error;
  }
  fillKbSelects();
  renderKbTable();
  renderWho();
}

async function showKb(kb) {
  const detail = $("kb-detail");
  detail.replaceChildren(el("p", { class: "muted" }, `loading ${kb}…`));
  try {
    const [stats, docs] = await Promise.all([api("GET", `/kbs/${encodeURIComponent(kb)}/stats`),
      api("GET", `/kbs/${encodeURIComponent(kb)}/documents`)]);
    detail.replaceChildren(renderStats(stats), renderDocuments(kb, docs.documents));
  } catch (error) {
    detail.replaceChildren();
    if (handleAuthLoss(error)) return;
    detail.append(el("p", { class: "error" }, explain(error)));
  }
}

function renderStats(stats) {
  const levels = stats.chunks_by_level || {};
  return el("section", { class: "panel", id: "kb-stats", "data-kb": stats.kb },
    el("h2", {}, `${stats.kb}: stats`),
    el("dl", { class: "facts" },
      el("dt", {}, "documents (active)"), el("dd", { id: "stat-documents" }, stats.documents),
      el("dt", {}, "documents by status"), el("dd", {}, pairs(stats.documents_by_status || {}) || "–"),
      el("dt", {}, "chunks per level"), el("dd", { id: "stat-levels" }, pairs(levels, "L")),
      el("dt", {}, "leaves in Milvus"), el("dd", { id: "stat-leaves" }, stats.leaves_in_milvus),
      el("dt", {}, "encoder"), el("dd", {}, stats.encoder ? `${stats.encoder.name} (dim ${stats.encoder.dim})` : "–"),
      el("dt", {}, "generation"), el("dd", {}, stats.generation),
      el("dt", {}, "consistency"), el("dd", { id: "stat-consistent", class: stats.consistent ? "good" : "error" },
        stats.consistent ? "consistent: Milvus holds exactly the SQL leaves"
          : `INCONSISTENT: Milvus holds ${stats.leaves_in_milvus} leaves, SQL ${levels["3"]} (run strata reconcile)`)));
}

function renderDocuments(kb, documents) {
  return el("section", { class: "panel", id: "kb-documents" },
    el("h2", {}, `${kb}: documents (${documents.length})`),
    el("table", { class: "table" },
      headRow(["document", "source", "version", "leaves", "chunks", "updated"]),
      el("tbody", {}, documents.map((d) => el("tr", { "data-doc-id": d.doc_id },
        el("td", {}, d.doc_id), el("td", {}, d.source), el("td", {}, d.version), el("td", {}, d.leaf_count),
        el("td", {}, d.chunk_count), el("td", {}, d.updated_at || "–"))))));
}

async function runUpload() {
  const kb = $("upload-kb").value.trim();
  // a folder's files keep their relative path (folder/file.md), as strata index names them
  const files = [...$("upload-files").files, ...$("upload-folder").files];
  if (!kb || !files.length) {
    fail($("upload-error"), "Choose files or a folder to upload.");
    return;
  }
  const form = new FormData();
  for (const file of files) form.append("files", file, file.webkitRelativePath || file.name);
  const query = $("upload-dry").checked ? "?dry_run=true" : "";
  fail($("upload-error"), "");
  const out = $("upload-out");
  out.replaceChildren(el("p", { class: "muted" }, `indexing ${files.length} file(s) into ${kb}…`));
  $("upload-run").disabled = true;
  try {
    const report = await api("POST", `/kbs/${encodeURIComponent(kb)}/documents${query}`, form);
    out.replaceChildren(renderReport(report));
    await refreshKbs();
    if (state.kbs.some((k) => k.kb_id === kb)) await showKb(kb);
  } catch (error) {
    out.replaceChildren();
    if (handleAuthLoss(error)) return;
    fail($("upload-error"), explain(error));
  } finally {
    $("upload-run").disabled = false;
  }
}

function renderReport(report) {
  const counts = ["added", "updated", "unchanged", "deleted", "failed"].filter((k) => k in report);
  return el("section", { id: "upload-report", class: "report" },
    el("h3", {}, `Indexing report: ${report.kb || ""}`),
    el("p", { id: "report-counts" }, counts.map((k) => `${report[k]} ${k}`).join(", ")),
    el("dl", { class: "facts" }, Object.entries(report)
      .filter(([k, v]) => !counts.includes(k) && k !== "kb" && (typeof v !== "object" || v === null))
      .map(([k, v]) => [el("dt", {}, k), el("dd", {}, fmt(v, 3))])),
    entries("error", "FAILED", report.failures), entries("muted", "skipped", report.skipped),
    entries("warning", "warning", report.warnings));
}

function entries(cls, word, items) {
  if (!items || !items.length) return null;
  return el("ul", { class: cls }, items.map((f) => el("li", {}, `${word} ${f.source}: ${f.reason || f.note || ""}`)));
}

document.addEventListener("DOMContentLoaded", boot);
