// The kairos web UI: one page, views drawn from the JSON API (/api/v1, described at
// /api/v1/openapi.json). Data is only ever put in the page as text, never as HTML.
"use strict";

const POLL_MS = 1000;
const LOG_LINES = 200;
const TERMINAL = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"];
const STATES = ["PENDING", "RUNNING", "SUSPENDED", "PREEMPTING", ...TERMINAL];

let me = null; // {user, role} once logged in
let view = { stop() {} }; // what the current view must stop (timers, streams) when left

// ---------- helpers ----------

/** An element: h("td", {class: "x"}, "text", child, [nested, children], …). */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === false || v === null || v === undefined) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const short = (s, prefix) => String(s || "").replace(prefix, "");
const stateOf = (j) => short(j.state, "JOB_STATE_");
const when = (ms) => (ms ? new Date(Number(ms)).toLocaleString() : "–");
const clock = (ms) => (ms ? new Date(Number(ms)).toLocaleTimeString() : "–");
const badge = (s) => h("span", { class: `badge s-${s}` }, s);
const nowMs = () => Date.now();

/** D-HH:MM:SS, as sacct and `kairos history` write durations. */
function hms(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  const d = Math.floor(s / 86400);
  const r = s % 86400;
  const two = (n) => String(n).padStart(2, "0");
  const t = `${two(Math.floor(r / 3600))}:${two(Math.floor((r % 3600) / 60))}:${two(r % 60)}`;
  return d ? `${d}-${t}` : t;
}

/** Seconds a job (or history record) has run: its last run's start to its end, or to now. */
function elapsedS(start, end, now) {
  if (!Number(start)) return null;
  return ((Number(end) || now) - Number(start)) / 1000;
}

/** An exit code as text: the code, and the signal that ended it if any. */
function exitText(code, signal) {
  const parts = [];
  if (code !== null && code !== undefined) parts.push(String(code));
  if (Number(signal)) parts.push(`signal ${signal}`);
  return parts.join(", ");
}
const operates = () => me && (me.role === "operator" || me.role === "admin");
const mayAct = (owner) => me && (me.user === owner || operates());

function csrf() {
  const m = document.cookie.match(/(?:^|;\s*)kairos_csrf=([^;]+)/);
  return m ? m[1] : "";
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** Calls the API; changes carry the CSRF value the login set. */
async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, {
    method, headers, signal, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) {
    const e = data.error || {};
    if (r.status === 401 && path !== "/ui/login") showLogin();
    throw new ApiError(r.status, e.code || String(r.status), e.message || r.statusText);
  }
  return data;
}

function setMain(title, ...children) {
  const main = document.getElementById("main");
  main.replaceChildren(h("h1", {}, title), ...children);
  document.title = `${title} · kairos`;
}

function failure(e) {
  return h("p", { role: "alert" }, `${e.code || "error"}: ${e.message}`);
}

/** Runs `tick` now and every POLL_MS, never two at once, until the view is left. */
function poll(tick) {
  let timer = null;
  let stopped = false;
  const run = async () => {
    try { await tick(); } catch (e) { if (!(e instanceof ApiError && e.status === 401)) console.warn(e); }
    if (!stopped) timer = setTimeout(run, POLL_MS);
  };
  run();
  return () => { stopped = true; clearTimeout(timer); };
}

const drawn = new WeakMap();
/** Redraws `el` only when what it shows changed, so focus and selection survive the polling. */
function redraw(el, data, build) {
  const key = JSON.stringify(data);
  if (drawn.get(el) === key) return;
  drawn.set(el, key);
  el.replaceChildren(...build());
}

// ---------- login ----------

function showLogin(message) {
  view.stop();
  view = { stop() {} };
  me = null;
  document.getElementById("nav").hidden = true;
  document.getElementById("logout").hidden = true;
  document.getElementById("who").textContent = "";
  const token = h("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const alert = h("p", { role: "alert", id: "login-error" }, message || "");
  const form = h("form", { class: "login", id: "login-form" },
    h("p", {}, "Log in with an API token (", h("code", {}, "kairos token create --user NAME"), ")."),
    h("label", { for: "token" }, "API token", token),
    h("p", {}, h("button", { type: "submit", id: "login-button" }, "Log in")),
    alert);
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    try {
      me = await api("/ui/login", { method: "POST", body: { token: token.value } });
      token.value = "";
      loggedIn();
      if (!location.hash || location.hash === "#/login") location.hash = "#/jobs";
      else route();
    } catch (e) {
      alert.textContent = `${e.code}: ${e.message}`;
    }
  });
  setMain("Log in", form);
  token.focus();
}

function loggedIn() {
  document.getElementById("nav").hidden = false;
  document.getElementById("logout").hidden = false;
  document.getElementById("who").textContent = `${me.user} (${me.role})`;
}

async function logout() {
  await api("/ui/logout", { method: "POST" }).catch(() => {});
  location.hash = "#/login";
  showLogin("Logged out.");
}

// ---------- jobs ----------

function jobsView() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const field = (name, label, input) => h("label", { for: `f-${name}` }, label, input);
  const state = h("select", { id: "f-state", name: "state" },
    h("option", { value: "" }, "pending and running"),
    h("option", { value: "all" }, "all"),
    STATES.map((s) => h("option", { value: s }, s.toLowerCase())));
  state.value = params.get("state") || "";
  const text = (name) => h("input", { id: `f-${name}`, name, value: params.get(name) || "", size: 10 });
  const inputs = { user: text("user"), qos: text("qos"), partition: text("partition"), name: text("name") };
  const form = h("form", { class: "filters", role: "search" },
    field("state", "State", state),
    ...Object.entries(inputs).map(([k, v]) => field(k, k[0].toUpperCase() + k.slice(1), v)),
    h("button", { type: "submit" }, "Filter"));
  const body = h("tbody", { id: "jobs-body" });
  const status = h("p", { class: "muted", id: "jobs-status", "aria-live": "polite" });
  const more = h("button", { type: "button", hidden: true }, "Load more");
  const open = new Set(); // arrays unfolded
  let pages = 1;
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    if (state.value) q.set("state", state.value);
    for (const [k, v] of Object.entries(inputs)) if (v.value.trim()) q.set(k, v.value.trim());
    location.hash = `#/jobs?${q}`;
  });
  more.addEventListener("click", () => { pages += 1; refresh(); });
  const query = (token) => {
    const q = new URLSearchParams({ limit: "200" });
    if (state.value === "all") q.set("all", "true");
    else if (state.value) q.set("states", state.value);
    for (const [k, v] of Object.entries(inputs)) if (v.value.trim()) q.set(k, v.value.trim());
    if (token) q.set("page_token", token);
    return `/api/v1/jobs?${q}`;
  };
  async function refresh() {
    let jobs = [];
    let token = "";
    for (let p = 0; p < pages; p++) {
      const page = await api(query(token));
      jobs = jobs.concat(page.jobs);
      token = page.next_page_token;
      if (!token) break;
    }
    more.hidden = !token;
    redraw(body, [jobs, [...open]], () => jobRows(jobs, open, refresh));
    tickTimes(body);
    status.textContent = `${jobs.length} job${jobs.length === 1 ? "" : "s"} · updated ${new Date().toLocaleTimeString()}`;
  }
  const table = h("table", { id: "jobs" },
    h("thead", {}, h("tr", {}, ["ID", "Name", "User", "QoS", "Partition", "State", "GPUs", "Node", "Pending reason", "Expected start", "Submitted",
      "Elapsed", "Time left", "Exit code"].map((c) => h("th", { scope: "col" }, c)))),
    body);
  setMain("Jobs", form, status, table, more);
  view = { stop: poll(refresh) };
}

/** Rows of the jobs table: an array's tasks folded under one row until it is opened. */
function jobRows(jobs, open, again) {
  const rows = [];
  const arrays = new Map();
  for (const j of jobs) {
    if (j.array_job_id && Number(j.array_job_id) !== 0) {
      if (!arrays.has(j.array_job_id)) { arrays.set(j.array_job_id, []); rows.push({ array: j.array_job_id }); }
      arrays.get(j.array_job_id).push(j);
    } else rows.push({ job: j });
  }
  return rows.flatMap((r) => {
    if (r.job) return [jobRow(r.job, String(r.job.id))];
    const tasks = arrays.get(r.array);
    const counts = {};
    for (const t of tasks) counts[stateOf(t)] = (counts[stateOf(t)] || 0) + 1;
    const isOpen = open.has(r.array);
    const toggle = h("button", { type: "button", "aria-expanded": String(isOpen), class: "fold" },
      `${isOpen ? "▾" : "▸"} ${r.array}_[${tasks.length} tasks]`);
    toggle.addEventListener("click", () => { isOpen ? open.delete(r.array) : open.add(r.array); again(); });
    const first = tasks[0];
    // The tasks' states in words, in the order of STATES: "RUNNING 1, PENDING 2".
    const words = STATES.filter((s) => counts[s]).concat(Object.keys(counts).filter((s) => !STATES.includes(s)))
      .map((s, i) => [i ? ", " : "", badge(s), ` ${counts[s]}`]);
    const head = h("tr", { class: "array", "data-array": r.array },
      h("td", {}, toggle), h("td", {}, first.spec?.name || ""), h("td", {}, first.user), h("td", {}, first.qos),
      h("td", {}, first.spec?.partition || ""),
      h("td", { class: "array-states" }, words), h("td", { colspan: 8 }));
    return [head, ...(isOpen ? tasks.map((t) => jobRow(t, `${t.array_job_id}_${t.array_task_id}`, "task")) : [])];
  });
}

function jobRow(j, label, cls) {
  const s = stateOf(j);
  const limit = Number(j.effective_time_limit_s || j.spec?.time_limit_s || 0);
  const running = !TERMINAL.includes(s) && s !== "PENDING";
  // Elapsed and time left move with the clock: tickTimes() fills them from these attributes.
  // (A requeued pending job's start is its last run's: it has not started this time.)
  const times = { "data-start": s === "PENDING" ? 0 : j.start_time_ms || 0, "data-end": running ? 0 : j.end_time_ms || 0,
    "data-limit": limit };
  return h("tr", { class: cls, "data-job": j.id },
    h("td", {}, h("a", { href: `#/jobs/${j.id}` }, label)),
    h("td", {}, j.spec?.name || ""), h("td", {}, j.user), h("td", {}, j.qos), h("td", {}, j.spec?.partition || ""),
    h("td", {}, badge(s)), h("td", {}, j.spec?.resources?.gpus ?? ""), h("td", {}, j.node || ""),
    // A run beyond its team's guarantee is marked: reclaim may take it back.
    h("td", {}, s === "PENDING" ? j.reason : j.borrowing && running ? "borrowing" : ""),
    // The planner's estimate (squeue --start), with why then in the cell's title.
    h("td", { class: "expected-start", title: j.start_reason || "" }, s === "PENDING" ? expectedStart(j) : ""),
    h("td", {}, when(j.submit_time_ms)),
    h("td", { class: "elapsed num", ...times }),
    h("td", { class: "left num", ...(TERMINAL.includes(s) ? {} : times) }),
    h("td", { class: "exit num" }, TERMINAL.includes(s) ? exitText(j.exit_code, j.signal) : ""));
}

/** Fills the elapsed and time-left cells under `root` for now (they change every second while
 *  the rows themselves are redrawn only when a job changed). */
function tickTimes(root) {
  const now = nowMs();
  for (const td of root.querySelectorAll("td.elapsed[data-start], td.left[data-start]")) {
    const start = Number(td.dataset.start);
    const limit = Number(td.dataset.limit);
    const ran = elapsedS(start, Number(td.dataset.end), now);
    let text = "";
    if (td.classList.contains("elapsed")) text = ran === null ? "" : hms(ran);
    else if (limit) text = hms(limit - (ran || 0)); // a pending job has its whole limit left
    else text = "no limit";
    if (td.textContent !== text) td.textContent = text;
  }
}

// ---------- history ----------

const SINCE = [["1h", 3600], ["24h", 86400], ["7d", 7 * 86400], ["30d", 30 * 86400], ["all", 0]];

/** The History columns: header, sort key of a record, cell of a record. */
const HISTORY_COLS = [
  ["ID", (r) => Number(r.id), (r) => h("a", { href: `#/jobs/${r.id}` },
    Number(r.array_job_id) ? `${r.array_job_id}_${r.array_task_id}` : String(r.id))],
  ["Name", (r) => r.name, (r) => r.name],
  ["User", (r) => r.user, (r) => r.user],
  ["Account", (r) => r.account, (r) => r.account],
  ["QoS", (r) => r.qos, (r) => r.qos],
  ["State", (r) => short(r.state, "JOB_STATE_"), (r) => badge(short(r.state, "JOB_STATE_"))],
  ["Exit code", (r) => (r.exit_code === null || r.exit_code === undefined ? -1e9 : Number(r.exit_code)),
    (r) => exitText(r.exit_code, r.signal)],
  ["GPUs", (r) => Number(r.gpus), (r) => r.gpus],
  ["Node", (r) => r.node, (r) => r.node],
  ["Submitted", (r) => Number(r.submit_time_ms), (r) => when(r.submit_time_ms)],
  ["Started", (r) => Number(r.start_time_ms), (r) => when(r.start_time_ms)],
  ["Ended", (r) => Number(r.end_time_ms) || Infinity, (r) => when(r.end_time_ms)],
  ["Elapsed", (r, now) => elapsedS(r.start_time_ms, r.end_time_ms, now) ?? -1,
    (r, now) => { const e = elapsedS(r.start_time_ms, r.end_time_ms, now); return e === null ? "" : hms(e); }],
  ["GPU-hours", (r) => Number(r.gpu_seconds), (r) => (Number(r.gpu_seconds) / 3600).toFixed(2)],
  ["Attempts", (r) => Number(r.attempts), (r) => r.attempts],
  ["Preemptions", (r) => Number(r.preemptions), (r) => r.preemptions],
];

/** The accounting history (`kairos history`): every job live in the window, those past the
 *  live state's retention included; sorted by a click on a column's header. */
function historyView() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const since = h("select", { id: "h-since", name: "since" },
    SINCE.map(([label]) => h("option", { value: label }, label === "all" ? "all kept" : `last ${label}`)));
  since.value = SINCE.some(([l]) => l === params.get("since")) ? params.get("since") : "24h";
  const state = h("select", { id: "h-state", name: "state" },
    h("option", { value: "" }, "any"), STATES.map((s) => h("option", { value: s }, s.toLowerCase())));
  state.value = params.get("state") || "";
  const user = h("input", { id: "h-user", name: "user", value: params.get("user") || "", size: 10 });
  const form = h("form", { class: "filters", role: "search" },
    h("label", { for: "h-since" }, "Live in", since), h("label", { for: "h-state" }, "State", state),
    h("label", { for: "h-user" }, "User", user), h("button", { type: "submit" }, "Filter"));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams({ since: since.value });
    if (state.value) q.set("state", state.value);
    if (user.value.trim()) q.set("user", user.value.trim());
    location.hash = `#/history?${q}`;
  });
  const sort = { col: "Ended", desc: true };
  const head = h("tr");
  const body = h("tbody", { id: "history-body" });
  const status = h("p", { class: "muted", "aria-live": "polite" });
  const more = h("button", { type: "button", hidden: true, id: "history-more" }, "Load more");
  let records = [];
  let token = "";
  const draw = () => {
    const now = nowMs();
    const [, key] = HISTORY_COLS.find(([c]) => c === sort.col);
    const rows = records.slice().sort((a, b) => {
      const x = key(a, now), y = key(b, now);
      const c = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return (sort.desc ? -c : c) || Number(b.id) - Number(a.id);
    });
    head.replaceChildren(...HISTORY_COLS.map(([c]) => {
      const b = h("button", { type: "button", class: "sort", "data-col": c }, c,
        sort.col === c ? (sort.desc ? " ▾" : " ▴") : "");
      b.addEventListener("click", () => {
        if (sort.col === c) sort.desc = !sort.desc;
        else Object.assign(sort, { col: c, desc: false });
        draw();
      });
      return h("th", { scope: "col", "aria-sort": sort.col === c ? (sort.desc ? "descending" : "ascending") : false }, b);
    }));
    body.replaceChildren(...rows.map((r) => h("tr", { "data-job": r.id, class: r.purged ? "purged" : false },
      HISTORY_COLS.map(([c, , cell]) => h("td", { "data-col": c }, cell(r, now))))));
    status.textContent = `${records.length} job${records.length === 1 ? "" : "s"}` +
      (token ? " (more to load)" : "") + ` · loaded ${new Date(now).toLocaleTimeString()}`;
    more.hidden = !token;
  };
  const load = async (next) => {
    const q = new URLSearchParams({ limit: "1000" });
    const secs = SINCE.find(([l]) => l === since.value)[1];
    if (secs) q.set("since_ms", String(nowMs() - secs * 1000));
    if (state.value) q.set("states", state.value);
    if (user.value.trim()) q.set("user", user.value.trim());
    if (next) q.set("page_token", next);
    const page = await api(`/api/v1/history?${q}`);
    records = next ? records.concat(page.records) : page.records;
    token = page.next_page_token;
    draw();
  };
  const refresh = h("button", { type: "button", id: "history-refresh" }, "Refresh");
  refresh.addEventListener("click", () => load("").catch((e) => status.replaceChildren(failure(e))));
  more.addEventListener("click", () => load(token).catch((e) => status.replaceChildren(failure(e))));
  setMain("History", form,
    h("p", { class: "muted" }, "Every job live in the window, finished ones included — also those past the ",
      "controllers' job retention, which the Jobs view no longer lists (", h("code", {}, "kairos history"), ")."),
    h("p", {}, refresh), status,
    h("table", { id: "history" }, h("thead", {}, head), body), more);
  draw();
  load("").catch((e) => status.replaceChildren(failure(e)));
}

// ---------- one job ----------

/** A pending job's expected start: the time, or "none" when the planner has no estimate. */
function expectedStart(j) {
  if (Number(j.expected_start_ms || 0)) return when(j.expected_start_ms);
  return j.start_reason ? "none" : "–";
}

/** "Why pending" in words, from the scheduler's reason. */
function whyPending(j) {
  const r = j.reason || "";
  if (j.spec?.hold || /held/i.test(r)) return `Held: it starts once released (${r}).`;
  if (/depend/i.test(r)) return `Waiting for the jobs it depends on: ${r}.`;
  if (/priority/i.test(r)) return `Other jobs come first (higher priority): ${r}.`;
  if (/resource|gpu|free/i.test(r)) return `Not enough free GPUs for it yet: ${r}.`;
  if (/limit|quota|qos/i.test(r)) return `A QoS or account limit holds it: ${r}.`;
  return r ? `Waiting: ${r}.` : "Waiting for the next scheduling pass.";
}

function jobView(id) {
  const ctl = new AbortController();
  let watch = null;
  view = { stop() { ctl.abort(); if (watch) watch.close(); } };
  const log = h("pre", { class: "log", id: "log", "aria-live": "off", tabindex: "0" }, "");
  const holder = h("div", { id: "job" }, h("p", { class: "muted" }, "Loading…"));
  const usage = h("div", { id: "usage" }, h("p", { class: "muted" }, "Loading…"));
  setMain(`Job ${id}`, holder, h("h2", {}, "Measured usage"), usage, h("h2", {}, "Log tail"), log);
  api(`/api/v1/jobs/${id}`, { signal: ctl.signal }).then((j) => {
    drawJob(holder, j);
    // Its usage once it has started (and again after each new start: a requeued run).
    let measured = "";
    let following = null;
    const measure = (job) => {
      const run = `${job.attempt || 0}@${job.start_time_ms || 0}`;
      if (!Number(job.start_time_ms) || run === measured) return;
      measured = run;
      if (following) following.abort(); // the earlier run's
      following = new AbortController();
      ctl.signal.addEventListener("abort", () => following.abort(), { once: true });
      followUsage(id, usage, following.signal);
    };
    usage.replaceChildren(h("p", { class: "muted" }, "Not started: nothing measured yet."));
    measure(j);
    if (!TERMINAL.includes(stateOf(j))) {
      // The job each time it changes, until it ends.
      watch = new EventSource(`/api/v1/jobs/${id}/events`);
      watch.onmessage = (ev) => { const next = JSON.parse(ev.data); drawJob(holder, next); measure(next); };
      watch.onerror = () => { watch.close(); };
    }
    followLog(id, log, ctl.signal);
  }).catch((e) => {
    if (e.name === "AbortError") return;
    if (e.status === 403) {
      setMain("403 — Forbidden", h("p", { class: "big403" }, "403"),
        h("p", { role: "alert" }, e.message), h("p", {}, h("a", { href: "#/jobs" }, "Back to the jobs")));
    } else if (e.status === 404) {
      setMain("404 — Not found", h("p", { role: "alert" }, e.message));
    } else holder.replaceChildren(failure(e));
  });
}

// ---------- measured usage ----------

const USAGE_MS = 5000;
const SVG = "http://www.w3.org/2000/svg";
const LINE_COLOURS = ["#0a4fa8", "#1b6e2e", "#a4161a", "#8a5a00", "#6a3d9a", "#0b7285", "#c2255c", "#495057"];

/** An SVG element (attributes set one by one; nothing parsed as markup). */
function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

/**
 * A line chart: one polyline per series (points [t, v]), time across, 0..max up, with a
 * caption and a legend. The chart is described in its title for screen readers.
 */
function chart(id, caption, lines, max, unit) {
  const W = 640, H = 160, L = 44, B = 18;
  const ts = lines.flatMap((l) => l.points.map((p) => p[0]));
  const t0 = Math.min(...ts), t1 = Math.max(...ts);
  const x = (t) => L + (t1 > t0 ? ((t - t0) / (t1 - t0)) * (W - L - 4) : 0);
  const y = (v) => 4 + (H - B - 4) * (1 - Math.min(v, max) / (max || 1));
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", id },
    s("title", {}, `${caption}: ${lines.map((l) => `${l.name} latest ${l.points.at(-1)?.[1] ?? "–"}${unit}`).join(", ")}`),
    s("line", { x1: L, y1: y(0), x2: W - 4, y2: y(0), stroke: "#8a94a6" }),
    s("line", { x1: L, y1: y(max), x2: W - 4, y2: y(max), stroke: "#d0d4da" }),
    s("text", { x: L - 4, y: y(max) + 4, "text-anchor": "end", "font-size": 11 }, `${Math.round(max)}${unit}`),
    s("text", { x: L - 4, y: y(0), "text-anchor": "end", "font-size": 11 }, `0${unit}`));
  lines.forEach((l, i) => {
    const pts = l.points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
    svg.append(s("polyline", { points: pts, fill: "none", stroke: LINE_COLOURS[i % LINE_COLOURS.length], "stroke-width": 2, "data-series": l.name }));
  });
  const legend = h("p", { class: "legend" }, lines.map((l, i) =>
    h("span", { class: `c${i % LINE_COLOURS.length}` }, `${l.name}: ${l.points.at(-1)?.[1] ?? "–"}${unit}`)));
  return h("figure", { class: "usage" }, h("figcaption", {}, caption), svg, legend);
}

/** The series (a UsageSeries as JSON) as charts and a summary. */
function drawUsage(el, u) {
  const samples = u.samples || [];
  if (!samples.length) {
    el.replaceChildren(h("p", { class: "muted" }, u.running ? "No sample yet." : "No samples were kept."));
    return;
  }
  const perGpu = {};
  for (const sm of samples) {
    for (const g of sm.gpus || []) {
      const k = Number(g.gpu || 0);
      (perGpu[k] ||= { util: [], mem: [] });
      perGpu[k].util.push([Number(sm.time_ms), Number(g.util_pct || 0)]);
      perGpu[k].mem.push([Number(sm.time_ms), Number(g.mem_mib || 0) / 1024]);
    }
  }
  const gpus = Object.keys(perGpu).sort((a, b) => a - b);
  const t = u.totals || {};
  const device = Number(t.gpu_mem_device_mib || 0) / 1024;
  const memMax = Math.max(device, ...gpus.flatMap((g) => perGpu[g].mem.map((p) => p[1])), 1);
  const host = samples.map((sm) => [Number(sm.time_ms), Number(sm.mem_kib || 0) / 1048576]);
  const cores = samples.map((sm) => [Number(sm.time_ms), Number(sm.cpu_milli || 0) / 1000]);
  const busy = Number(t.gpu_ms) ? (100 * Number(t.gpu_busy_ms || 0) / Number(t.gpu_ms)).toFixed(1) : "–";
  el.replaceChildren(
    h("p", { id: "usage-summary" }, `${u.running ? "Running" : "Ended"} on ${u.node || "–"} (attempt ${u.attempt || 0}), ` +
      `sampled every ${Number(u.interval_ms || 0) / 1000} s · GPU utilisation mean ${busy} %, max ${t.gpu_util_max_pct || 0} % · ` +
      `peak GPU memory ${(Number(t.gpu_mem_max_mib || 0) / 1024).toFixed(1)} GiB · peak host memory ${(Number(u.max_rss_kib || 0) / 1048576).toFixed(1)} GiB`),
    gpus.length ? chart("usage-gpu-util", "GPU utilisation (%)", gpus.map((g) => ({ name: `GPU ${g}`, points: perGpu[g].util })), 100, " %") : null,
    gpus.length ? chart("usage-gpu-mem", "GPU memory (GiB)", gpus.map((g) => ({ name: `GPU ${g}`, points: perGpu[g].mem.map(([x, v]) => [x, +v.toFixed(1)]) })), memMax, " GiB") : null,
    chart("usage-cpu", "CPU cores", [{ name: "cores", points: cores }], Math.max(1, ...cores.map((p) => p[1])), ""),
    chart("usage-mem", "Host memory (GiB)", [{ name: "memory", points: host.map(([x, v]) => [x, +v.toFixed(2)]) }],
      Math.max(1, ...host.map((p) => p[1])), " GiB"),
  );
}

/** Draws the job's usage series into `el`, refreshed every USAGE_MS while its run runs. */
async function followUsage(id, el, signal) {
  while (!signal.aborted) {
    try {
      const u = await api(`/api/v1/jobs/${id}/usage`, { signal });
      drawUsage(el, u);
      if (!u.running) return;
    } catch (e) {
      if (e.name === "AbortError") return;
      el.replaceChildren(h("p", { class: "muted" }, `(no usage: ${e.message})`));
      if (e.status === 404 || e.status === 403 || e.status === 400) return;
    }
    await new Promise((done) => { const t = setTimeout(done, USAGE_MS); signal.addEventListener("abort", () => { clearTimeout(t); done(); }, { once: true }); });
  }
}

/** Streams the job's output into `pre`, keeping the last LOG_LINES lines. */
async function followLog(id, pre, signal) {
  try {
    const r = await fetch(`/api/v1/jobs/${id}/logs?follow=true`, { signal, credentials: "same-origin" });
    if (!r.ok) {
      const e = (await r.json().catch(() => ({}))).error || {};
      pre.textContent = `(no log: ${e.message || r.statusText})`;
      return;
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let text = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
      const lines = text.split("\n");
      if (lines.length > LOG_LINES + 1) text = lines.slice(-LOG_LINES - 1).join("\n");
      pre.textContent = text;
      pre.scrollTop = pre.scrollHeight;
    }
  } catch (e) {
    if (e.name !== "AbortError") pre.textContent += `\n(log stream ended: ${e.message})`;
  }
}

function drawJob(holder, j) {
  // The page is drawn from two sources (its events, an action's answer) that may arrive out of
  // order: never go back to a snapshot with fewer events than the one shown.
  const events = (j.events || []).length;
  if (Number(holder.dataset.events || 0) > events) return;
  holder.dataset.events = String(events);
  const s = stateOf(j);
  const spec = j.spec || {};
  const res = spec.resources || {};
  const actions = h("div", { class: "actions" });
  if (mayAct(j.user)) {
    const act = (label, verb, cls) => {
      const b = h("button", { type: "button", class: cls, id: `${verb}-button` }, label);
      b.addEventListener("click", async () => {
        b.disabled = true;
        try { drawJob(holder, await api(`/api/v1/jobs/${j.id}/${verb}`, { method: "POST", body: {} })); }
        catch (e) { actions.append(failure(e)); b.disabled = false; }
      });
      return b;
    };
    if (!TERMINAL.includes(s)) actions.append(act("Cancel", "cancel", "danger"));
    if (s === "PENDING" && !spec.hold) actions.append(act("Hold", "hold"));
    if (s === "PENDING" && spec.hold) actions.append(act("Release", "release"));
  }
  const dl = (pairs) => h("dl", { class: "spec" }, pairs.filter(([, v]) => v !== "" && v !== undefined)
    .flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  const attempts = (j.tasks || []).length
    ? j.tasks.map((t) => `rank ${t.rank}: ${t.node} GPUs [${(t.gpu_ids || []).join(",")}]`).join("; ")
    : (j.node ? `${j.node} GPUs [${(j.gpu_ids || []).join(",")}]` : "");
  holder.replaceChildren(...[
    h("p", {}, badge(s), " ", spec.name ? `“${spec.name}” ` : "", `by ${j.user}, QoS ${j.qos}`,
      j.array_job_id && Number(j.array_job_id) ? `, array ${j.array_job_id}_${j.array_task_id}` : ""),
    actions,
    s === "PENDING" ? h("p", { class: "why", id: "why-pending" }, whyPending(j)) : null,
    s === "PENDING" && j.start_reason ? h("p", { class: "why", id: "expected-start" },
      `Expected start: ${expectedStart(j)} (${j.start_reason}).`) : null,
    h("div", { class: "cols" },
      h("section", {}, h("h2", {}, "Spec"), dl([
        ["command", (spec.argv || []).join(" ")], ["image", spec.container?.image || ""], ["profile", short(spec.profile || j.profile, "PROFILE_").toLowerCase()],
        ["partition", spec.partition], ["account", spec.account], ["GPUs", res.gpus], ["CPUs", res.cpus || ""],
        ["memory", res.memory_mib ? `${res.memory_mib} MiB` : ""], ["time limit", spec.time_limit_s ? `${spec.time_limit_s} s` : ""],
        ["requeue", spec.requeue === undefined ? "" : String(spec.requeue)],
        ["checkpoint signal", spec.checkpoint?.signal || ""], ["priority", j.priority],
        ["topology", topologyAsk(res.topology)],
      ])),
      h("section", {}, h("h2", {}, "Attempts"), dl([
        ["attempt", j.attempt], ["placement", attempts], ["domains", domainsOf(j)], ["submitted", when(j.submit_time_ms)],
        ["started", when(j.start_time_ms)], ["ended", when(j.end_time_ms)],
        ["exit code", j.exit_code ?? ""], ["last checkpoint", j.last_checkpoint_ms ? when(j.last_checkpoint_ms) : ""],
      ]))),
    h("h2", {}, "Timeline"),
    h("ol", { class: "timeline", id: "timeline" }, (j.events || []).map((e) =>
      h("li", { class: `k-${e.kind}` }, h("time", {}, clock(e.time_ms)), h("span", { class: "kind" }, e.kind), e.message))),
  ].filter(Boolean));
}

// ---------- nodes and GPUs ----------

/** A job's topology ask as `kairos submit --topology` takes it (`rack=required`). */
function topologyAsk(t) {
  if (!t) return "";
  const level = t.level || "lowest level";
  return `${level}=${t.required ? "required" : "preferred"}` + (Number(t.max_domains) > 1 ? `, at most ${t.max_domains}` : "");
}

/** The topology domains the job's latest allocation got, as its `allocated` event names them. */
function domainsOf(j) {
  const e = (j.events || []).filter((x) => x.kind === "allocated").pop();
  const at = e ? e.message.indexOf("; ") : -1;
  return at < 0 ? "" : e.message.slice(at + 2);
}

/** Nodes in order of their domains, highest level first, each group under a heading naming it
 *  with its free GPUs (no levels: one group, no heading). */
function byDomain(nodes, topology) {
  const levels = [...(topology.levels || [])].reverse();
  const where = Object.fromEntries((topology.resolved || []).map((r) => [r.node, r.domains || {}]));
  const path = (n) => levels.map((l) => where[n.name]?.[l] || "-");
  const free = (n) => short(n.state, "NODE_STATE_") !== "UP" ? 0
    : (n.info?.gpus || []).length - Object.keys(n.allocated || {}).length - (n.faults || []).length;
  const sorted = [...nodes].sort((a, b) => path(a).join("/").localeCompare(path(b).join("/")) || a.name.localeCompare(b.name));
  const groups = [];
  for (const n of sorted) {
    const key = path(n).join("/");
    if (!groups.length || groups[groups.length - 1].key !== key) groups.push({ key, path: path(n), nodes: [] });
    groups[groups.length - 1].nodes.push(n);
  }
  return groups.map((g) => ({ ...g,
    title: levels.length ? levels.map((l, i) => `${l} ${g.path[i]}`).join(" · ") + ` — ${g.nodes.reduce((s, n) => s + free(n), 0)} GPUs free` : "" }));
}

function gpuCell(node, g, shares) {
  const fault = (node.faults || []).find((f) => f.gpu === g.index);
  const job = node.allocated?.[g.index];
  const shared = shares.filter((s) => s.gpu === g.index);
  const state = short(node.state, "NODE_STATE_");
  const cloud = Boolean(node.info?.labels?.["kairos.io/burst-intent"]);
  let cls = "free", what = "free";
  if (fault) { cls = "unhealthy"; what = `unhealthy: ${fault.reason}`; }
  else if (job) { cls = "allocated"; what = "job "; }
  else if (shared.length) { cls = "allocated"; what = "shared "; }
  else if (node.maint) { cls = "draining"; what = `maintenance (${node.maint})`; }
  else if (state === "DRAINING") { cls = "draining"; what = "draining"; }
  else if (state === "DOWN") { cls = "unhealthy"; what = "node down"; }
  else if (cloud) { cls = "cloud"; what = "free (cloud)"; }
  return h("div", { class: `gpu ${cls}`, "data-gpu": `${node.name}/${g.index}` },
    h("strong", {}, `GPU ${g.index}`), h("span", { class: "muted" }, g.model || ""), h("br"),
    what,
    job ? h("a", { href: `#/jobs/${job}` }, String(job)) : null,
    shared.map((s) => [h("a", { href: `#/jobs/${s.job_id}` }, String(s.job_id)), ` (${s.milli / 10}%) `]),
    cloud && cls !== "cloud" ? h("div", { class: "muted" }, "cloud") : null);
}

/** Drain or resume a node: shown to operators and admins only (the server checks the role). */
function nodeActions(n, state) {
  const box = h("div", { class: "actions" });
  const verb = state === "DRAINING" ? "resume" : "drain";
  const b = h("button", { type: "button", class: "admin-action", id: `${verb}-${n.name}` },
    verb === "drain" ? "Drain" : "Resume");
  b.addEventListener("click", async () => {
    b.disabled = true;
    const body = verb === "drain" ? { reason: `from the web UI by ${me.user}` } : {};
    try { await api(`/api/v1/nodes/${encodeURIComponent(n.name)}/${verb}`, { method: "POST", body }); }
    catch (e) { box.append(failure(e)); }
  });
  box.append(b);
  return box;
}

function nodesView() {
  const holder = h("div", { id: "nodes" });
  const legend = h("div", { class: "legend", "aria-label": "Legend" },
    ["free", "allocated", "unhealthy", "draining", "cloud"].map((c) => h("span", { class: `gpu ${c}` }, c)));
  setMain("Nodes & GPUs", legend, holder);
  view = { stop: poll(async () => {
    const [{ nodes }, topology] = await Promise.all([api("/api/v1/nodes"), api("/api/v1/topology").catch(() => ({}))]);
    for (const n of nodes) delete n.last_heartbeat_ms;
    redraw(holder, [nodes, topology.levels, topology.resolved], () => byDomain(nodes, topology).flatMap((g) => [
      g.title ? h("h2", { class: "domain", "data-domain": g.key }, g.title) : null,
    ].concat(g.nodes.map((n) => {
      // A node an open maintenance reservation holds shows as MAINT (its drain state aside).
      const state = n.maint ? "MAINT" : short(n.state, "NODE_STATE_");
      const info = n.info || {};
      return h("section", { class: "node", "data-node": n.name },
        h("h2", {}, n.name, badge(state), h("span", { class: "muted" },
          `${info.gpu_backend || ""} · CPUs ${n.cpus_used}/${info.cpus} · memory ${n.memory_used_mib}/${info.memory_mib} MiB`),
          n.reason ? h("span", { class: "muted" }, `(${n.reason})`) : null),
        operates() ? nodeActions(n, state) : null,
        h("div", { class: "gpus" }, (info.gpus || []).map((g) => gpuCell(n, g, n.shared || []))));
    }))).filter(Boolean));
    if (!nodes.length) redraw(holder, [], () => [h("p", { class: "muted" }, "No node has registered.")]);
  }) };
}

// ---------- queue and policy ----------

function meter(used, limit) {
  if (!limit) return h("span", {}, `${used} `, h("span", { class: "muted" }, "(no limit)"));
  const pct = Math.min(100, Math.round((100 * used) / limit));
  const bar = h("i");
  bar.style.width = `${pct}%`; // through the CSSOM: the CSP allows no inline style attribute
  return h("span", {}, h("span", { class: "meter", role: "img", "aria-label": `${used} of ${limit}` }, bar),
    ` ${used}/${limit}`);
}

function policyView() {
  const holder = h("div", { id: "policy" });
  setMain("Queue & policy", holder);
  view = { stop: poll(async () => {
    const [policy, shares, pre, jobs, burst] = await Promise.all([
      api("/api/v1/policy"), api("/api/v1/fairshare"), api("/api/v1/preemptions"),
      api("/api/v1/jobs?limit=1000"), api("/api/v1/burst").catch(() => null),
    ]);
    const per = {};
    for (const j of jobs.jobs) {
      const q = (per[j.qos] ||= { run: 0, pend: 0 });
      const g = Number(j.spec?.resources?.gpus || 0) * Math.max(1, Number(j.spec?.resources?.tasks || 1));
      if (stateOf(j) === "PENDING") q.pend += g; else q.run += g;
    }
    const table = (cols, rows, id) => h("table", { id }, h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows));
    const seen = operates() ? "" : " — your jobs";
    const qos = table(["QoS", "priority", "preempts", "mode", `running GPUs (vs group limit${seen})`, `pending GPUs${seen}`, "headroom", "burstable"],
      policy.qos.map((q) => {
        const u = per[q.name] || { run: 0, pend: 0 };
        return h("tr", {}, h("td", {}, q.name), h("td", {}, q.priority), h("td", {}, (q.preempt || []).join(", ")),
          h("td", {}, short(q.preempt_mode, "PREEMPT_MODE_").toLowerCase()), h("td", {}, meter(u.run, q.grp_gpus)),
          h("td", {}, u.pend), h("td", {}, q.headroom_gpus || ""), h("td", {}, q.burstable ? "yes" : ""));
      }), "qos-table");
    const fair = table(["account", "parent", "shares", "GPU-hours used (decayed)", "fairshare factor"],
      shares.accounts.map((a) => h("tr", {}, h("td", {}, a.name), h("td", {}, a.parent), h("td", {}, a.shares),
        h("td", {}, (Number(a.usage_gpu_s) / 3600).toFixed(2)), h("td", {}, Number(a.fairshare_factor).toFixed(3)))), "fairshare-table");
    const recent = pre.preemptions.slice(-20).reverse();
    const pres = table(["time", "preemptor", "victim", "what happened", "node", "GPU-s lost"],
      recent.map((p) => h("tr", {}, h("td", {}, when(p.time_ms)), h("td", {}, h("a", { href: `#/jobs/${p.preemptor}` }, String(p.preemptor))),
        h("td", {}, h("a", { href: `#/jobs/${p.victim}` }, String(p.victim))), h("td", {}, p.mode), h("td", {}, p.node),
        h("td", {}, p.gpu_s_lost))), "preemptions-table");
    const parts = [h("h2", {}, "QoS: GPUs running and pending against limits"), qos,
      h("h2", {}, "Fairshare by account"), fair,
      h("h2", {}, `Recent preemptions${operates() ? "" : " of your jobs"}`), recent.length ? pres : h("p", { class: "muted" }, "None recently.")];
    if (burst) {
      const $ = (m) => `$${(Number(m) / 1000).toFixed(2)}`;
      parts.push(h("h2", {}, "Cloud burst"), burst.enabled
        ? h("div", { id: "burst" },
          h("p", {}, "instances ", meter(burst.live_instances, burst.max_instances), " · GPUs ", meter(burst.live_gpus, burst.max_gpus),
            ` · spend ${$(burst.hourly_spend_milli)}/h of ${$(burst.max_hourly_spend_milli)}/h · spent ${$(burst.spent_milli)}`),
          table(["intent", "type", "GPUs", "spot", "state", "node", "jobs"], burst.instances.map((i) => h("tr", {},
            h("td", {}, i.intent), h("td", {}, i.instance_type), h("td", {}, i.gpus), h("td", {}, i.spot ? "spot" : "on-demand"),
            h("td", {}, i.state), h("td", {}, i.node), h("td", {}, (i.jobs || []).join(", ")))), "burst-table"))
        : h("p", { class: "muted" }, "Burst is off."));
    }
    redraw(holder, [policy, shares, pre, per, burst], () => parts);
  }) };
}

// ---------- routing ----------

function route() {
  view.stop();
  view = { stop() {} };
  if (!me) return;
  const hash = location.hash || "#/jobs";
  const path = hash.slice(1).split("?")[0];
  for (const a of document.querySelectorAll("nav a")) {
    if (path.startsWith(`/${a.dataset.view}`)) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  const job = path.match(/^\/jobs\/(\d+)$/);
  if (job) jobView(job[1]);
  else if (path === "/history") historyView();
  else if (path === "/nodes") nodesView();
  else if (path === "/policy") policyView();
  else if (path === "/login") showLogin();
  else jobsView();
  document.getElementById("main").focus({ preventScroll: true });
}

window.addEventListener("hashchange", () => (me ? route() : showLogin()));
window.addEventListener("DOMContentLoaded", async () => {
  document.getElementById("logout").addEventListener("click", logout);
  try {
    me = await api("/api/v1/whoami");
    loggedIn();
    route();
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401)) showLogin(`${e.code}: ${e.message}`);
  }
});
