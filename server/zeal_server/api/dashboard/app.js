// Zeal operator dashboard: plain JavaScript, no build step, nothing fetched from elsewhere.
// Every figure comes from the HTTP API (/api/v1, see /docs); text from the server is only
// ever inserted as text, never as markup.
"use strict";

const API = "/api/v1";
const REFRESH_MS = 10000;
const SVG_NS = "http://www.w3.org/2000/svg";
const WINDOWS = { "1h": 3600, "1d": 86400, "1w": 604800 };
// The comparison methods of GET …/compare (docs/comparison.md); "reading" stands for
// unit=reading.
const COMPARE_METHODS = [
  ["cluster", "Devices: reading-weighted, cluster-robust (default)"],
  ["device_means", "Devices: mean of device means (Welch)"],
  ["trimmed", "Trimmed mean (10 % each end)"],
  ["winsorized", "Winsorized mean (10 % each end)"],
  ["censored", "Censored normal MLE (10 % each end)"],
  ["reading", "Readings as independent (only if they are)"],
];
const METHOD_NAMES = {
  cluster: "reading-weighted, cluster-robust",
  device_means: "mean of device means, Welch",
  trimmed: "trimmed device means (Yuen)",
  winsorized: "winsorized device means",
  censored: "censored normal MLE of device means",
  reading: "readings as independent",
};
// Which of the policy's caps skip readings (GET /preview's binding).
const CAP_NAMES = { none: "neither", hour: "the hour's", day: "the day's", both: "both the hour's and the day's" };
const NICE_SECONDS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
  21600, 43200, 86400, 172800, 604800];
const PAGE = 25;
// Up to this many readings in a window, the page also shows the Bayes estimate of its mean.
const FEW_READINGS = 1000;
// The quantile lines the chart offers, and about how many points such a line has at most
// (each is a fit and a bootstrap on the server).
const QUANTILE_LINES = ["0.5", "0.9", "0.95"];
const QUANTILE_POINTS = 24;

// -- small helpers ---------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

function svgEl(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined));
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function fmt(x, digits = 3) {
  return x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(digits);
}

function withUnit(text, unit) {
  return unit && text !== "–" && text !== "no readings" ? `${text} ${unit}` : text;
}

// An interval as the API serves it, cut to the stream's range (zeal.estimate.cut: the
// average of readings in [lower, upper] lies there); cut again here, which changes nothing.
function within(interval, stream) {
  const lo = Math.max(interval[0], stream.lower), hi = Math.min(interval[1], stream.upper);
  return withUnit(`${fmt(lo)} – ${fmt(hi)}`, stream.unit);
}

// Text as a sentence: ends with a full stop (two joined never run together).
function sentence(text) {
  const t = String(text).trim();
  return /[.!?]$/.test(t) ? t : `${t}.`;
}

function fmtQ(q) {
  return `${Number((q * 100).toPrecision(6))} %`;
}

function fmtShare(share) {
  return `${(share * 100).toFixed(1)} %`;
}

function fmtInt(x) {
  return x === null || x === undefined ? "–" : Number(x).toLocaleString("en-US");
}

function fmtP(p) {
  if (p === null || p === undefined) return "–";
  return p < 1e-4 ? p.toExponential(2) : p.toPrecision(3);
}

function fmtTime(iso) {
  if (!iso) return "never";
  return new Date(iso).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  if (s < 172800) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} days ago`;
}

function isoAgo(seconds) {
  return new Date(Date.now() - seconds * 1000).toISOString();
}

function describeDuration(seconds) {
  if (seconds % 86400 === 0) return `${seconds / 86400} d`;
  if (seconds % 3600 === 0) return `${seconds / 3600} h`;
  if (seconds % 60 === 0) return `${seconds / 60} min`;
  return `${seconds} s`;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function token() {
  return sessionStorage.getItem("zeal-token") || "";
}

// A heavy read past the server's slots is answered 429 with Retry-After (docs/server.md,
// "Heavy reads"): a page asks for several at once, so it waits and asks again, 5 times.
async function api(path, options = {}) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  for (let attempt = 0; ; attempt += 1) {
    response = await fetch(path, {
      method: options.method || "GET",
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
    });
    if (response.status !== 429 || attempt === 5) break;
    const wait = Number(response.headers.get("Retry-After")) || 2;
    await new Promise((resolve) => setTimeout(resolve, 1000 * Math.min(wait, 10)));
  }
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (!response.ok) throw new ApiError(response.status, problemText(response.status, body));
  return body;
}

function problemText(status, body) {
  const detail = body && body.detail;
  let text;
  if (Array.isArray(detail)) {
    text = detail.map((d) => {
      // The server's messages start with their field ("epsilon: must be ..."); older ones
      // did not, and get it from loc.
      const where = (d.loc || []).filter((p) => p !== "body" && p !== "query").join(".");
      return where && !String(d.msg).startsWith(`${where}:`) ? `${where}: ${d.msg}` : d.msg;
    }).join("; ");
  } else {
    text = detail || `HTTP ${status}`;
  }
  if (status === 401) return `${text}. Enter the token above.`;
  if (status === 403) return `${text}. Check the token above.`;
  return text;
}

function query(params) {
  const parts = [];
  for (const [key, value] of Object.entries(params)) {
    if (value === null || value === undefined || value === "") continue;
    parts.push(`${encodeURIComponent(key)}=${encodeURIComponent(value)}`);
  }
  return parts.length ? `?${parts.join("&")}` : "";
}

function streamPath(name) {
  return `${API}/streams/${encodeURIComponent(name)}`;
}

function showProblem(message) {
  const box = document.getElementById("problem");
  box.textContent = message || "";
  box.hidden = !message;
}

function figure(label, id, value = "–") {
  return el("div", { class: "figure" },
    el("div", { class: "label", id: `${id}-label` , text: label }),
    el("div", { class: "value", id, "aria-labelledby": `${id}-label ${id}`, text: value }));
}

function pairs(rows) {
  return rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]);
}

function set(id, text) {
  const node = document.getElementById(id);
  if (node) node.textContent = text;
}

// -- views -------------------------------------------------------------------------------------

let current = null; // { refresh: async () => void }
let generation = 0;

async function runRefresh() {
  if (!current) return;
  const mine = generation;
  try {
    await current.refresh();
    if (mine !== generation) return;
    showProblem("");
    set("updated", `Updated ${new Date().toISOString().replace("T", " ").slice(0, 19)} UTC`);
  } catch (error) {
    if (mine !== generation) return;
    showProblem(error instanceof ApiError ? error.message : `Cannot reach the server: ${error.message}`);
  }
}

function route() {
  generation += 1;
  const hash = location.hash || "#/";
  const [path, search] = hash.slice(1).split("?");
  const params = new URLSearchParams(search || "");
  const main = document.getElementById("main");
  main.replaceChildren();
  showProblem("");
  if (path.startsWith("/stream/")) {
    current = streamView(main, decodeURIComponent(path.slice("/stream/".length)), params);
  } else if (path === "/new") {
    current = createView(main);
  } else {
    current = overviewView(main);
  }
  runRefresh();
}

// Overview: one row per stream, figures over the last hour.

function overviewView(main) {
  const body = el("tbody", { id: "streams-body" });
  main.append(
    el("h1", { text: "Streams" }),
    el("section", { class: "card", "aria-labelledby": "overview-title" },
      el("h2", { id: "overview-title", text: "Last hour" }),
      el("table", { id: "streams" },
        el("caption", { class: "sr-only", text: "Streams with their average over the last hour" }),
        el("thead", {}, el("tr", {},
          el("th", { scope: "col", text: "Stream" }),
          el("th", { scope: "col", class: "num", text: "Average" }),
          el("th", { scope: "col", class: "num", text: "95 % interval" }),
          el("th", { scope: "col", class: "num", text: "Guaranteed" }),
          el("th", { scope: "col", class: "num", text: "Readings" }),
          el("th", { scope: "col", class: "num", text: "Devices" }),
          el("th", { scope: "col", class: "num", text: "ε / reading" }),
          el("th", { scope: "col", class: "num", text: "Payload bits" }),
          el("th", { scope: "col", text: "Health" }))),
        body)),
  );
  return {
    async refresh() {
      const streams = await api(`${API}/streams`);
      const start = isoAgo(3600);
      const rows = await Promise.all(streams.map(async (s) => {
        const [avg, stats] = await Promise.all([
          api(`${streamPath(s.name)}/average${query({ start })}`),
          api(`${streamPath(s.name)}/stats?efficiency=false`),  // the overview shows none
        ]);
        return overviewRow(s, avg, stats, start);
      }));
      if (!rows.length) {
        rows.push(el("tr", {}, el("td", { colspan: 9 },
          "No streams yet. ", el("a", { href: "#/new", text: "Create one" }), ".")));
      }
      body.replaceChildren(...rows);
    },
  };
}

function health(stats) {
  const rejected = Object.values(stats.rejects).reduce((a, b) => a + b, 0);
  const fresh = stats.last_seen && Date.now() - new Date(stats.last_seen).getTime() < 300000;
  const parts = [];
  if (!stats.last_seen) parts.push(el("span", { class: "badge idle", text: "no data yet" }));
  else parts.push(el("span", { class: `badge ${fresh ? "ok" : "idle"}`,
    text: fresh ? "live" : "quiet", title: `last data ${fmtTime(stats.last_seen)}` }),
    ` last data ${ago(stats.last_seen)}`);
  if (rejected) parts.push(" ", el("span", { class: "badge warn", text: `${fmtInt(rejected)} rejected` }));
  return parts;
}

function overviewRow(stream, avg, stats, start) {
  const e = avg.estimate;
  return el("tr", { "data-stream": stream.name },
    el("th", { scope: "row" }, el("a", { href: `#/stream/${encodeURIComponent(stream.name)}`, text: stream.name })),
    el("td", { class: "num", "data-testid": "overview-mean", "data-start": start,
      "data-mean": e ? String(e.mean) : "", text: e ? withUnit(fmt(e.mean), stream.unit) : "no readings" }),
    el("td", { class: "num", text: e ? within(e.ci, stream) : "–" }),
    el("td", { class: "num", text: e ? within(e.guaranteed, stream) : "–" }),
    el("td", { class: "num", text: fmtInt(avg.n) }),
    el("td", { class: "num", text: fmtInt(stats.active_devices) }),
    el("td", { class: "num", text: String(stream.epsilon) }),
    el("td", { class: "num", text: String(stream.payload_bits) }),
    el("td", {}, health(stats)));
}

// Stream page: figures and chart over a window, groups, efficiency, devices, rejects.

function streamView(main, name, params) {
  const state = {
    window: params.get("window") || "1h",
    start: params.get("start") || "",
    end: params.get("end") || "",
    interval: params.get("interval") || "auto",
    group: params.get("group") || "",
    a: params.get("a") || "",
    b: params.get("b") || "",
    method: COMPARE_METHODS.some(([m]) => m === params.get("method")) ? params.get("method") : "cluster",
    quantiles: params.get("quantiles") || "0.5,0.9,0.95",
    above: params.get("above") || "",
    quantile: QUANTILE_LINES.includes(params.get("quantile")) ? params.get("quantile") : "",
    sort: "name",
    descending: false,
    page: 0,
    editing: null,
  };
  let stream = null;
  let groups = [];

  const windowSelect = el("select", { id: "window" },
    el("option", { value: "1h", text: "Last hour" }),
    el("option", { value: "1d", text: "Last day" }),
    el("option", { value: "1w", text: "Last week" }),
    el("option", { value: "all", text: "All data" }),
    el("option", { value: "custom", text: "Custom…" }));
  const startInput = el("input", { id: "custom-start", type: "datetime-local", step: 1 });
  const endInput = el("input", { id: "custom-end", type: "datetime-local", step: 1 });
  const customBox = el("span", { class: "controls", id: "custom-box" },
    el("label", { for: "custom-start" }, "From (UTC)", startInput),
    el("label", { for: "custom-end" }, "To (UTC)", endInput));
  const intervalSelect = el("select", { id: "interval" });
  const groupSelect = el("select", { id: "group" });
  const groupA = el("select", { id: "group-a" });
  const groupB = el("select", { id: "group-b" });
  const methodSelect = el("select", { id: "compare-method" },
    ...COMPARE_METHODS.map(([value, text]) => el("option", { value, text })));
  const summary = el("div", { class: "figures", id: "summary" },
    figure("Average", "window-mean"),
    figure("95 % interval (normal)", "window-ci"),
    figure("Guaranteed interval", "window-guaranteed"),
    figure("Standard error", "window-se"),
    figure("Readings", "window-n"),
    figure("Bayes estimate (few readings)", "window-bayes"),
    el("p", { class: "note", id: "range-note",
      text: "Intervals (here, on the chart and in the API) are cut to the stream's range: the average cannot lie outside it. The estimate itself is not cut, so that it stays unbiased: with few readings it can fall outside the range, and outside its intervals." }));
  const chartBox = el("div", { id: "chart-box" });
  const quantileSelect = el("select", { id: "quantile-line" },
    el("option", { value: "", text: "None" }),
    ...QUANTILE_LINES.map((q) => el("option", { value: q, text: `${Math.round(Number(q) * 100)} % quantile` })));
  const distLevels = el("input", { id: "dist-quantiles", type: "text", value: state.quantiles,
    inputmode: "decimal", spellcheck: "false" });
  const distAbove = el("input", { id: "dist-above", type: "number", step: "any", value: state.above });
  const distBox = el("div", { id: "dist-box" });
  const distFigures = el("div", { class: "figures", id: "dist-figures" });
  const distNote = el("p", { class: "muted", id: "dist-note", "aria-live": "polite" });
  const pointsBody = el("tbody", { id: "points-body" });
  const compareOut = el("div", { class: "figures", id: "compare-out" },
    figure("Group A average", "compare-a"),
    figure("Group B average", "compare-b"),
    figure("Difference A − B", "compare-diff"),
    figure("95 % interval of the difference", "compare-ci"),
    figure("p-value (equal means)", "compare-p"),
    figure("Method", "compare-method-out"),
    figure("Estimand", "compare-estimand"),
    figure("Degrees of freedom", "compare-df"),
    figure("Independent units (A / B)", "compare-units"));
  const compareNote = el("p", { class: "muted", id: "compare-note" });
  const compareWarnings = el("ul", { class: "warnings", id: "compare-warnings", "aria-live": "polite" });
  const planField = (id, label, attrs) => el("label", { for: id }, label,
    el("input", { id, name: id, type: "number", step: "any", ...attrs }));
  const planShape = el("select", { id: "plan-shape", name: "plan-shape" },
    el("option", { value: "normal", text: "Normal" }),
    el("option", { value: "lognormal", text: "Skewed (lognormal, simulated)" }));
  const planForm = el("form", { class: "form", id: "plan-form", novalidate: true },
    planField("plan-devices", "Devices per group", { min: "2", step: "1", value: "20" }),
    planField("plan-readings", "Readings per device (mean)", { min: "1", step: "1", value: "100" }),
    planField("plan-readings-cv", "Their coefficient of variation", { min: "0", value: "0" }),
    planField("plan-between", "Spread of device means (sd)", { min: "0", required: true }),
    planField("plan-within", "Spread of readings within a device (sd)", { min: "0", required: true }),
    planField("plan-mean", "Typical reading (blank: mid-range)", {}),
    el("label", { for: "plan-shape" }, "Shape of device means", planShape),
    planField("plan-effect", "Difference to detect", { min: "0", value: "0" }),
    planField("plan-alpha", "Level α", { min: "0", max: "1", value: "0.05" }),
    planField("plan-power", "Power wanted", { min: "0", max: "1", value: "0.8" }));
  const planOut = el("dl", { class: "params", id: "plan-out" });
  const planNote = el("p", { class: "muted", id: "plan-note", "aria-live": "polite" });
  const planBox = el("details", { id: "plan-box" },
    el("summary", { text: "Plan a comparison: standard error, power and the smallest detectable difference" }),
    planForm, planOut, planNote);
  const efficiencyBody = el("tbody", { id: "efficiency-body" });
  const devicesBody = el("tbody", { id: "devices-body" });
  const devicesHead = el("tr", {});
  const pagerText = el("span", { id: "devices-page", "aria-live": "polite" });
  const prev = el("button", { type: "button", id: "devices-prev", text: "Previous" });
  const next = el("button", { type: "button", id: "devices-next", text: "Next" });
  const rejectsBody = el("tbody", { id: "rejects-body" });
  const sendersBody = el("tbody", { id: "senders-body" });
  const accountsBody = el("tbody", { id: "accounts-body" });
  const paramsList = el("dl", { class: "params", id: "stream-params" });
  const mechanismList = el("dl", { class: "params", id: "mechanism-params" });
  const title = el("h1", { text: name });

  main.append(
    el("p", {}, el("a", { href: "#/", text: "← All streams" })),
    title,
    el("section", { class: "card", "aria-labelledby": "window-title" },
      el("h2", { id: "window-title", text: "Debiased average" }),
      el("div", { class: "controls" },
        el("label", { for: "window" }, "Window", windowSelect),
        customBox,
        el("label", { for: "interval" }, "Interval per point", intervalSelect),
        el("label", { for: "group" }, "Devices", groupSelect),
        el("label", { for: "quantile-line" }, "Quantile line on the chart", quantileSelect)),
      summary,
      chartBox,
      el("div", { class: "legend", id: "legend" },
        el("span", {}, el("span", { class: "swatch mean" }), "debiased average per interval"),
        el("span", {}, el("span", { class: "swatch normal" }), "95 % normal-approximation interval"),
        el("span", {}, el("span", { class: "swatch guaranteed" }),
          "guaranteed interval (Bernstein bound, holds for any data)"),
        el("span", { id: "legend-quantile", hidden: !state.quantile },
          el("span", { class: "swatch quantile" }), "the chosen quantile of the readings per interval")),
      el("details", {}, el("summary", { text: "The numbers behind the chart" }),
        el("table", { id: "points" },
          el("thead", {}, el("tr", {},
            el("th", { scope: "col", text: "Interval start" }),
            el("th", { scope: "col", class: "num", text: "Readings" }),
            el("th", { scope: "col", class: "num", text: "Average" }),
            el("th", { scope: "col", class: "num", text: "95 % interval" }),
            el("th", { scope: "col", class: "num", text: "Guaranteed" }),
            el("th", { scope: "col", class: "num", text: `Bayes estimate (at most ${fmtInt(FEW_READINGS)} readings; uniform prior)` }))),
          pointsBody))),
    el("section", { class: "card", "aria-labelledby": "dist-title" },
      el("h2", { id: "dist-title", text: "Distribution of the readings" }),
      el("p", { class: "muted", text: "Estimated from the privatized codes of the window above " +
        "(same window and devices), at no further privacy cost: each reading weighs the same." }),
      el("div", { class: "controls" },
        el("label", { for: "dist-quantiles" }, "Quantiles (comma-separated)", distLevels),
        el("label", { for: "dist-above" }, "Share above", distAbove)),
      distFigures, distBox, distNote),
    el("section", { class: "card", "aria-labelledby": "compare-title" },
      el("h2", { id: "compare-title", text: "Compare two groups" }),
      el("div", { class: "controls" },
        el("label", { for: "group-a" }, "Group A", groupA),
        el("label", { for: "group-b" }, "Group B", groupB),
        el("label", { for: "compare-method" }, "Method", methodSelect)),
      compareOut, compareNote, compareWarnings, planBox),
    el("div", { class: "grid2" },
      el("section", { class: "card", "aria-labelledby": "efficiency-title" },
        el("h2", { id: "efficiency-title", text: "Bits per reading" }),
        el("div", { class: "figures", id: "efficiency-lead" },
          figure("On the wire (each reading, headers and timestamps included)", "eff-lead-wire"),
          figure("On disk, all in (every table and index)", "eff-lead-disk")),
        el("table", { id: "efficiency" },
          el("thead", {}, el("tr", {},
            el("th", { scope: "col", text: "Format" }),
            el("th", { scope: "col", class: "num", text: "Bits / reading" }),
            el("th", { scope: "col", class: "num", text: "Zeal saves" }))),
          efficiencyBody),
        el("p", { class: "muted", id: "efficiency-note" }),
        el("details", { id: "efficiency-paper" },
          el("summary", { text: "The paper's own ratios" }),
          el("p", { class: "muted", id: "efficiency-paper-note" }))),
      el("section", { class: "card", "aria-labelledby": "params-title" },
        el("h2", { id: "params-title", text: "Parameters" }), paramsList,
        el("details", { id: "mechanism-box" },
          el("summary", { text: "Mechanism details (what the devices were configured with)" }),
          mechanismList),
        el("h2", { id: "rejects-title", class: "spaced", text: "Rejected and repeated messages" }),
        el("table", { id: "rejects", "aria-labelledby": "rejects-title" },
          el("thead", {}, el("tr", {},
            el("th", { scope: "col", text: "Reason" }),
            el("th", { scope: "col", class: "num", text: "Messages" }))),
          rejectsBody),
        el("h3", { id: "senders-title", class: "spaced", text: "Who sent the rejected messages" }),
        el("table", { id: "senders", "aria-labelledby": "senders-title" },
          el("thead", {}, el("tr", {},
            el("th", { scope: "col", text: "Name on the topic" }),
            el("th", { scope: "col", class: "num", text: "Messages" }),
            el("th", { scope: "col", text: "Reasons" }),
            el("th", { scope: "col", text: "Latest" }))),
          sendersBody))),
    el("section", { class: "card", "aria-labelledby": "devices-title" },
      el("h2", { id: "devices-title", text: "Devices" }),
      el("table", { id: "devices" }, el("thead", {}, devicesHead), devicesBody),
      el("div", { class: "pager" }, prev, next, pagerText),
      el("h2", { id: "accounts-title", class: "spaced", text: "Privacy its devices spent, over all their streams" }),
      el("table", { id: "accounts", "aria-labelledby": "accounts-title" },
        el("thead", {}, el("tr", {},
          el("th", { scope: "col", text: "Over" }),
          el("th", { scope: "col", class: "num", text: "Median ε" }),
          el("th", { scope: "col", class: "num", text: "90th percentile ε" }),
          el("th", { scope: "col", class: "num", text: "Most ε" }))),
        accountsBody),
      el("p", { class: "muted", text: "Each device's epsilon booked over every stream it " +
        "sends to (its account), spread over this stream's devices; a device with nothing " +
        "booked counts 0." })),
  );

  windowSelect.value = state.window;
  startInput.value = state.start;
  endInput.value = state.end;

  function keepInUrl() {
    const keep = { window: state.window, interval: state.interval === "auto" ? "" : state.interval,
      group: state.group, a: state.a, b: state.b,
      method: state.method === "cluster" ? "" : state.method,
      quantiles: state.quantiles === "0.5,0.9,0.95" ? "" : state.quantiles,
      above: state.above, quantile: state.quantile };
    if (state.window === "custom") Object.assign(keep, { start: state.start, end: state.end });
    history.replaceState(null, "", `#/stream/${encodeURIComponent(name)}${query(keep)}`);
  }

  function windowBounds() {
    if (state.window in WINDOWS) return { start: isoAgo(WINDOWS[state.window]), end: null };
    if (state.window === "custom") {
      return {
        start: state.start ? `${state.start}Z` : null,
        end: state.end ? `${state.end}Z` : null,
      };
    }
    return { start: null, end: null };
  }

  function intervalSeconds(bounds) {
    const bucket = stream.bucket_seconds;
    if (state.interval !== "auto") return Number(state.interval);
    const from = bounds.start ? new Date(bounds.start).getTime() : new Date(stream.created).getTime();
    const to = bounds.end ? new Date(bounds.end).getTime() : Date.now();
    const wanted = Math.max(1, (to - from) / 1000 / 120);
    const nice = NICE_SECONDS.filter((s) => s % bucket === 0 && s >= wanted);
    return nice.length ? nice[0] : Math.ceil(wanted / bucket) * bucket;
  }

  function fillIntervals() {
    const bucket = stream.bucket_seconds;
    const options = [el("option", { value: "auto", text: "Automatic" })];
    for (const s of NICE_SECONDS.filter((x) => x % bucket === 0)) {
      options.push(el("option", { value: String(s), text: describeDuration(s) }));
    }
    intervalSelect.replaceChildren(...options);
    intervalSelect.value = state.interval;
    if (intervalSelect.value !== state.interval) {
      intervalSelect.append(el("option", { value: state.interval, text: describeDuration(Number(state.interval)) }));
      intervalSelect.value = state.interval;
    }
  }

  function fillGroups() {
    const make = (select, value, none) => {
      select.replaceChildren(el("option", { value: "", text: none }),
        ...groups.map((g) => el("option", { value: g.group, text: `${g.group} (${g.devices} devices)` })));
      select.value = value;
    };
    make(groupSelect, state.group, "All devices");
    make(groupA, state.a, "Choose a group");
    make(groupB, state.b, "Choose a group");
  }

  function showParams() {
    const rows = [
      ["Range", withUnit(`[${stream.lower}, ${stream.upper}]`, stream.unit)],
      ["Unit", stream.unit || "– (not declared)"],
      ["ε per reading", String(stream.epsilon)],
      ["Privacy policy", stream.max_epsilon_per_day === null
        ? "none (a stream made before policies)"
        : `at most ${stream.max_epsilon_per_day.toLocaleString("en-US", { maximumFractionDigits: 6 })} ε ` +
          `per device per UTC day (${fmtInt(stream.readings_per_day)} readings, ` +
          `at most ${fmtInt(stream.readings_per_hour)} in one UTC hour)`],
      ["Realized ε", stream.realized_epsilon === null ? "– (paper sampler)" : stream.realized_epsilon.toPrecision(12)],
      ["Bucket", describeDuration(stream.bucket_seconds)],
      ["Created", fmtTime(stream.created)],
    ];
    const mechanism = [
      ["Payload bits", `${stream.payload_bits} sent per reading`],
      ["Shared bits", `${stream.shared_bits} (the same in every privatized value: never sent)`],
      ["Sampler", stream.sampler],
      ["Abar", stream.abar.toExponential(6)],
      ["C", stream.C.toFixed(4)],
      ["Grid step", stream.grid_step.toPrecision(6)],
      ["Fingerprint", stream.fingerprint],
    ];
    paramsList.replaceChildren(...pairs(rows));
    mechanismList.replaceChildren(...pairs(mechanism));
    if (stream.description) title.after(el("p", { class: "muted", text: stream.description }));
  }

  const columns = [
    ["name", "Device", false], [null, "Tags", false], ["first_seen", "First seen", false],
    ["last_seen", "Last seen", false], ["readings", "Readings", true], ["epsilon_spent", "ε spent", true],
    [null, "ε today", true], ["account_last_30_days", "ε all streams, 30 d", true],
    [null, "Sequence resets", true], ["missing", "Missing", true],
    [null, "Flags", false],
  ];

  function drawDeviceHead() {
    devicesHead.replaceChildren(...columns.map(([key, label, numeric]) => {
      const th = el("th", { scope: "col", class: numeric ? "num" : null });
      if (!key) {
        th.textContent = label;
        return th;
      }
      const active = state.sort === key;
      th.setAttribute("aria-sort", active ? (state.descending ? "descending" : "ascending") : "none");
      th.append(el("button", {
        type: "button", "data-sort": key,
        text: `${label}${active ? (state.descending ? " ▼" : " ▲") : ""}`,
        onclick: () => {
          if (state.sort === key) state.descending = !state.descending;
          else { state.sort = key; state.descending = key !== "name"; }
          state.page = 0;
          drawDeviceHead();
          loadDevices().catch((e) => showProblem(e.message));
        },
      }));
      return th;
    }));
  }

  async function loadDevices() {
    const out = await api(`${streamPath(name)}/devices${query({
      limit: PAGE, offset: state.page * PAGE, sort: state.sort, descending: state.descending })}`);
    devicesBody.replaceChildren(...out.devices.map((d) => el("tr", { "data-device": d.name },
      el("td", { text: d.name }),
      tagsCell(d),
      el("td", { text: fmtTime(d.first_seen) }),
      el("td", { text: fmtTime(d.last_seen) }),
      el("td", { class: "num", text: fmtInt(d.readings) }),
      el("td", { class: "num", text: fmt(d.epsilon_spent, 2) }),
      el("td", { class: "num today", text: fmt(d.epsilon_today, 2),
        title: "ε spent on readings stamped in the current UTC day, the period of the stream's policy" }),
      el("td", { class: "num account", text: fmt(d.account.last_30_days, 2),
        title: `ε the device spent over all its streams: ${fmt(d.account.last_7_days, 2)} in 7 ` +
          `days, ${fmt(d.account.last_30_days, 2)} in 30, ${fmt(d.account.last_365_days, 2)} in ` +
          `365, ${fmt(d.account.since_first_seen, 2)} since first seen` }),
      el("td", { class: "num", text: fmtInt(d.sequence_resets),
        title: "batches stored although their sequence number had been used before: the " +
          "device's outbox started again, or two agents share its id" }),
      el("td", { class: "num", text: fmtInt(d.missing),
        title: `sequence numbers that never arrived, counted once they no longer can; ` +
          `${fmtInt(d.late)} batches came out of order` }),
      el("td", { class: d.flags.length ? "flags flagged" : "flags", text: d.flags.join(", ") || "–",
        title: "implausible: its readings prove it dishonest (exclude=implausible leaves it out " +
          "of averages); over_budget: batches refused at the privacy policy; device_cap: " +
          "batches refused at the device's daily cap across all its streams; at_cap: today's " +
          "readings, or those of one of today's UTC hours, reached the policy" }))));
    if (!out.devices.length) devicesBody.append(el("tr", {}, el("td", { colspan: 11, text: "No devices yet." })));
    const first = out.total ? out.offset + 1 : 0;
    pagerText.textContent = `${fmtInt(first)}–${fmtInt(out.offset + out.devices.length)} of ${fmtInt(out.total)}`;
    prev.disabled = state.page === 0;
    next.disabled = out.offset + out.devices.length >= out.total;
  }

  // Tags are edited in place as "key:value, key:value" and saved with the operator token.
  function tagsText(tags) {
    return Object.entries(tags).map(([k, v]) => `${k}:${v}`).join(", ");
  }

  function tagsCell(device) {
    const cell = el("td", { class: "tags" });
    const show = () => {
      state.editing = null;
      cell.replaceChildren(
      el("span", { text: tagsText(device.tags) || "–" }), " ",
      el("button", { type: "button", class: "small", text: "Edit",
        "aria-label": `Edit the tags of ${device.name}`, onclick: edit }));
    };
    const edit = () => {
      state.editing = device.name; // the 10 s refresh leaves the devices table alone meanwhile
      const input = el("input", { type: "text", value: tagsText(device.tags), size: 24,
        "aria-label": `Tags of ${device.name} (key:value, separated by commas)`,
        placeholder: "site:north, floor:2" });
      const message = el("span", { class: "message error", role: "alert" });
      const save = async () => {
        const tags = {};
        for (const part of input.value.split(",").map((p) => p.trim()).filter(Boolean)) {
          const at = part.indexOf(":");
          if (at < 1) {
            message.textContent = ` "${part}" is not key:value`;
            return;
          }
          tags[part.slice(0, at).trim()] = part.slice(at + 1).trim();
        }
        try {
          const saved = await api(`${streamPath(name)}/devices/${encodeURIComponent(device.name)}/tags`,
            { method: "PUT", body: { tags } });
          device.tags = saved.tags;
          show();
          groups = await api(`${streamPath(name)}/groups`);
          fillGroups();
        } catch (error) {
          message.textContent = ` Not saved: ${error.message}`;
        }
      };
      input.addEventListener("keydown", (event) => {
        if (event.key === "Enter") save();
        if (event.key === "Escape") show();
      });
      cell.replaceChildren(input, " ",
        el("button", { type: "button", class: "small", text: "Save", onclick: save }), " ",
        el("button", { type: "button", class: "small", text: "Cancel", onclick: show }), message);
      input.focus();
    };
    show();
    return cell;
  }

  prev.addEventListener("click", () => { state.page = Math.max(0, state.page - 1); loadDevices().catch((e) => showProblem(e.message)); });
  next.addEventListener("click", () => { state.page += 1; loadDevices().catch((e) => showProblem(e.message)); });

  let windowAsked = 0;
  let compareAsked = 0;

  async function loadWindow() {
    const mine = ++windowAsked;
    const bounds = windowBounds();
    const interval = intervalSeconds(bounds);
    const common = { start: bounds.start, end: bounds.end, group: state.group };
    // estimator=bayes (model mean) reads what AVG* reads: with few readings AVG* can leave
    // the range and its interval can be wider than it, so the page shows the Bayes
    // estimate of the window's mean beside it then (docs/bayes.md).
    const qInterval = quantileInterval(bounds, interval);
    const [avg, series, quantiles] = await Promise.all([
      api(`${streamPath(name)}/average${query({ ...common, estimator: "bayes" })}`),
      api(`${streamPath(name)}/series${query({ ...common, interval_seconds: interval, estimator: "bayes" })}`),
      // each point of a quantile line is a fit and a bootstrap: fewer, longer intervals
      state.quantile ? api(`${streamPath(name)}/series${query({ ...common,
        interval_seconds: qInterval, quantile: state.quantile })}`) : null,
    ]);
    if (mine !== windowAsked) return; // a newer choice is on its way
    const e = avg.estimate;
    const b = avg.n <= FEW_READINGS ? avg.bayes : null;
    summary.dataset.bayes = b ? String(b.mean) : "";
    set("window-bayes", b ? withUnit(`${fmt(b.mean)} (${fmt(b.interval[0])} – ${fmt(b.interval[1])})`, stream.unit)
      : (avg.n ? "– (enough readings: the average is the estimate)" : "–"));
    set("window-bayes-label", b ? `Bayes estimate, ${Math.round(b.level * 100)} % credible interval (prior: ${b.prior})`
      : "Bayes estimate (few readings)");
    summary.dataset.start = bounds.start || "";
    summary.dataset.end = bounds.end || "";
    summary.dataset.group = state.group;
    summary.dataset.interval = String(interval);
    summary.dataset.mean = e ? String(e.mean) : "";
    const unit = stream.unit;
    set("window-mean", e ? withUnit(fmt(e.mean), unit) : "no readings");
    set("window-ci", e ? within(e.ci, stream) : "–");
    set("window-guaranteed", e ? within(e.guaranteed, stream) : "–");
    set("window-se", e ? withUnit(fmt(e.std_error, 4), unit) : "–");
    set("window-n", fmtInt(avg.n));
    const line = quantiles ? quantiles.points.filter((p) => p.quantile) : [];
    const chart = drawChart(series.points, stream, interval, name, state.group, line);
    chart.dataset.quantileInterval = state.quantile ? String(qInterval) : "";
    chartBox.replaceChildren(chart);
    document.getElementById("legend-quantile").hidden = !state.quantile;
    pointsBody.replaceChildren(...series.points.map((p) => el("tr", {},
      el("td", { text: fmtTime(p.start) }),
      el("td", { class: "num", text: fmtInt(p.n) }),
      el("td", { class: "num", text: p.estimate ? withUnit(fmt(p.estimate.mean), unit) : "–" }),
      el("td", { class: "num", text: p.estimate ? within(p.estimate.ci, stream) : "–" }),
      el("td", { class: "num", text: p.estimate ? within(p.estimate.guaranteed, stream) : "–" }),
      el("td", { class: "num bayes", text: p.bayes && p.n <= FEW_READINGS
        ? withUnit(`${fmt(p.bayes.mean)} (${fmt(p.bayes.interval[0])} – ${fmt(p.bayes.interval[1])})`, unit) : "–" }))));
  }

  function quantileInterval(bounds, interval) {
    const bucket = stream.bucket_seconds;
    const from = bounds.start ? new Date(bounds.start).getTime() : new Date(stream.created).getTime();
    const to = bounds.end ? new Date(bounds.end).getTime() : Date.now();
    const wanted = Math.max(interval, (to - from) / 1000 / QUANTILE_POINTS);
    const nice = NICE_SECONDS.filter((s) => s % bucket === 0 && s >= wanted);
    return nice.length ? nice[0] : Math.ceil(wanted / bucket) * bucket;
  }

  let distAsked = 0;

  async function loadDistribution() {
    const mine = ++distAsked;
    const bounds = windowBounds();
    const asked = { start: bounds.start, end: bounds.end, group: state.group,
      quantiles: state.quantiles, above: state.above };
    let body;
    try {
      body = await api(`${streamPath(name)}/distribution${query(asked)}`);
    } catch (error) {
      if (mine !== distAsked) return;
      // an empty window, or levels the server refuses: its reason, in place of the figures
      distFigures.replaceChildren();
      distBox.replaceChildren();
      distNote.textContent = error.message;
      distBox.dataset.asked = JSON.stringify(asked);
      return;
    }
    if (mine !== distAsked) return;
    const unit = stream.unit;
    const ends = (x) => (x.low === null ? "no interval" : `${fmt(x.low)} – ${fmt(x.high)}`);
    distFigures.replaceChildren(
      ...body.quantiles.map((item) => el("div", { class: "figure quantile", "data-q": String(item.q),
        "data-value": String(item.value) },
      el("div", { class: "label", text: `${fmtQ(item.q)} quantile, ${Math.round(body.confidence * 100)} % interval` }),
      el("div", { class: "value", text: withUnit(`${fmt(item.value)} (${ends(item)})`, unit) }))),
      ...(body.above ? [el("div", { class: "figure", id: "dist-above-out", "data-share": String(body.above.share) },
        el("div", { class: "label", text: withUnit(`Share above ${fmt(body.above.threshold)}`, unit) }),
        el("div", { class: "value", text: body.above.low === null ? fmtShare(body.above.share)
          : `${fmtShare(body.above.share)} (${fmtShare(body.above.low)} – ${fmtShare(body.above.high)})` }))] : []),
      el("div", { class: "figure" }, el("div", { class: "label", text: "Readings (devices)" }),
        el("div", { class: "value", id: "dist-n", text: `${fmtInt(body.n)} (${fmtInt(body.devices)})` })));
    distBox.replaceChildren(drawHistogram(body, stream, name));
    const why = body.intervals || `Intervals: a bootstrap over the window's ${fmtInt(body.devices)} devices.`;
    distNote.textContent = `${sentence(why)} Estimated: ${sentence(body.estimand)}`;
    distBox.dataset.asked = JSON.stringify(asked);
  }

  async function loadCompare() {
    const mine = ++compareAsked;
    if (!state.a || !state.b) {
      for (const id of ["compare-a", "compare-b", "compare-diff", "compare-ci", "compare-p",
        "compare-method-out", "compare-estimand", "compare-df", "compare-units"]) set(id, "–");
      compareWarnings.replaceChildren();
      for (const key of Object.keys(compareOut.dataset)) delete compareOut.dataset[key];
      compareNote.textContent = groups.length
        ? "Choose two groups to compare their averages over the window above."
        : "Tag devices (PUT …/devices/{device}/tags) to compare groups.";
      return;
    }
    const bounds = windowBounds();
    const reading = state.method === "reading";
    const asked = { group_a: state.a, group_b: state.b, start: bounds.start, end: bounds.end,
      independent: reading ? "reading" : "", method: reading ? "" : state.method };
    const out = await api(`${streamPath(name)}/compare${query(asked)}`);
    if (mine !== compareAsked) return;
    compareOut.dataset.query = query(asked);
    compareOut.dataset.p = out.p_value === null ? "" : String(out.p_value);
    compareOut.dataset.difference = out.difference === null ? "" : String(out.difference);
    compareOut.dataset.method = out.method;
    compareOut.dataset.df = out.df === null ? "" : String(out.df);
    set("compare-method-out", METHOD_NAMES[out.method] || out.method);
    set("compare-estimand", out.estimand || "–");
    set("compare-df", out.df === null ? "∞ (normal)" : fmt(out.df, 1));
    set("compare-units", out.partitions
      ? `${fmtInt(out.partitions[0])} / ${fmtInt(out.partitions[1])} devices`
      : (reading ? `${fmtInt(out.n_a)} / ${fmtInt(out.n_b)} readings` : "–"));
    compareWarnings.replaceChildren(...out.warnings.map((w) => el("li", { text: w })));
    set("compare-a", out.mean_a === null ? "–" : `${withUnit(fmt(out.mean_a), stream.unit)} (n ${fmtInt(out.n_a)})`);
    set("compare-b", out.mean_b === null ? "–" : `${withUnit(fmt(out.mean_b), stream.unit)} (n ${fmtInt(out.n_b)})`);
    set("compare-diff", withUnit(fmt(out.difference), stream.unit));
    set("compare-ci", out.ci ? withUnit(`${fmt(out.ci[0])} – ${fmt(out.ci[1])}`, stream.unit) : "–");
    set("compare-p", fmtP(out.p_value));
    const reference = out.df === null ? "normal approximation" : `t on ${fmt(out.df, 1)} df`;
    compareNote.textContent = out.p_value === null
      ? "No inference for this choice: see the warnings below."
      : out.p_value < 0.05
        ? `The groups differ (p < 0.05, ${reference}).`
        : `No evidence that the groups differ at the 5 % level (${reference}).`;
  }

  let planAsked = 0;

  async function loadPlan() {
    // GET …/preview/compare for this stream's range, ε and code width (docs/comparison.md).
    const mine = ++planAsked;
    const value = (id) => document.getElementById(id).value.trim();
    const asked = { lower: stream.lower, upper: stream.upper, epsilon: stream.epsilon,
      payload_bits: stream.payload_bits, devices: value("plan-devices"),
      readings: value("plan-readings"), readings_cv: value("plan-readings-cv"),
      between_sd: value("plan-between"), within_sd: value("plan-within"), mean: value("plan-mean"),
      shape: planShape.value, effect: value("plan-effect"), alpha: value("plan-alpha"),
      power: value("plan-power") };
    try {
      const plan = await api(`${API}/preview/compare${query(asked)}`);
      if (mine !== planAsked) return;
      const unit = stream.unit;
      const rows = [
        ["Standard error of the difference", withUnit(fmt(plan.std_error, 4), unit)],
        ["Degrees of freedom", fmt(plan.df, 0)],
        [`Power at a difference of ${fmt(plan.effect)}`, fmt(plan.power, 3)],
        [`Smallest difference found with power ${plan.target_power}`, withUnit(fmt(plan.detectable_effect, 3), unit)],
        ["Zeal's variance per reading", fmt(plan.noise_variance, 3)],
        ["Power from", plan.power_from],
      ];
      planOut.replaceChildren(...pairs(rows));
      Object.assign(planOut.dataset, { query: query(asked), stdError: String(plan.std_error),
        power: String(plan.power), detectable: String(plan.detectable_effect) });
      planNote.textContent = `At level ${plan.alpha}, for the default method (cluster).`;
      planNote.classList.remove("bad");
    } catch (error) {
      if (mine !== planAsked) return;
      planOut.replaceChildren();
      for (const key of Object.keys(planOut.dataset)) delete planOut.dataset[key];
      planNote.textContent = `No plan: ${error.message}`;
      planNote.classList.add("bad");
    }
  }

  // Who sent the rejected messages: the ten names with the most (GET .../rejects).
  async function loadSenders() {
    const out = await api(`${streamPath(name)}/rejects${query({ limit: 10 })}`);
    const rows = out.senders.map((x) => el("tr", {},
      el("td", {}, x.device, x.known ? null : el("span", { class: "muted", text: " (never stored a reading)" })),
      el("td", { class: "num", text: fmtInt(x.messages) }),
      el("td", { text: Object.entries(x.reasons).map(([r, n]) => `${r} ${fmtInt(n)}`).join(", ") }),
      el("td", { text: new Date(x.last).toISOString().replace(".000Z", "Z") })));
    if (out.other_senders) {
      rows.push(el("tr", { id: "senders-others" },
        el("td", { class: "muted", text: `${fmtInt(out.other_senders)} other ${out.other_senders === 1 ? "name" : "names"}` }),
        el("td", { class: "num", text: fmtInt(out.other_messages) }), el("td"), el("td")));
    }
    sendersBody.replaceChildren(...(rows.length
      ? rows : [el("tr", {}, el("td", { colspan: 4, text: "No message rejected." }))]));
  }

  async function loadStats() {
    const stats = await api(`${streamPath(name)}/stats`);
    const e = stats.efficiency;
    if (!e) {
      efficiencyBody.replaceChildren(el("tr", {}, el("td", { colspan: 3, text: "No stored readings yet." })));
      set("eff-lead-wire", "–");
      set("eff-lead-disk", "–");
    } else {
      const row = (label, bits, ratio, id) => el("tr", { id },
        el("td", { text: label }), el("td", { class: "num", text: fmt(bits, 2) }),
        el("td", { class: "num", text: ratio === null ? "" : `${fmt(ratio, 1)}×` }));
      // Until a bucket closes its readings are stored raw: the store rows then describe the
      // raw parts, and comparing them with the paper's compressed format would mislead.
      const raw = e.compacted === 0;
      const store = raw ? " (raw, not yet compacted)" : "";
      const group = (text) => el("tr", { class: "group" }, el("th", { scope: "rowgroup", colspan: 3, text }));
      // The float alternatives sit beside what they compare with: the wire's beside the wire
      // figure, the paper's float64 store beside the codes column. The all-in figure holds
      // timestamps, devices, ledger and indexes, which no alternative here counts.
      efficiencyBody.replaceChildren(
        group("On the wire"),
        row("Zeal (measured payloads)", e.wire_bits, null, "eff-wire"),
        row("JSON message per reading", e.json_bits, e.wire_vs_json, "eff-json"),
        row("Raw float64 value alone (no timestamp)", e.float64_bits, e.wire_vs_float64, "eff-float64"),
        group("On disk"),
        row(`Zeal's codes column${store}`, e.store_code_bits, null, "eff-store"),
        row("Paper's store: float64 x* + zstd", e.paper_store_bits, raw ? null : e.store_vs_paper, "eff-paper-store"),
        row(`Zeal's segments: codes, timestamps, devices${store}`, e.store_bits, null, "eff-segment"),
        row("Zeal's database, all in: every table and index", e.database_bits, null, "eff-database"));
      // A ratio below 1 (a small batch's headers outweigh its readings) is said as a cost.
      const times = (ratio) => ratio >= 1 ? `${fmt(ratio, 1)}× less` : `${fmt(1 / ratio, 1)}× more`;
      set("eff-lead-wire", `${fmt(e.wire_bits, 1)} bits: ${times(e.wire_vs_json)} than JSON, ` +
        `${times(e.wire_vs_float64)} than a float64 value alone`);
      set("eff-lead-disk", `${e.database_pages_grown ? "" : "at least "}${fmt(e.database_bits, 1)} bits` + (raw ? " (raw, not yet compacted)"
        : `; the codes alone ${fmt(e.store_code_bits, 2)}, ${times(e.store_vs_paper)} than the paper's float64 store`));
      const compaction = raw
        ? "No bucket is compacted yet: readings are stored raw until their bucket closes, " +
          "then compressed (every 30 s for closed buckets); the store rows show the raw parts " +
          "until then, so no saving against the paper's store is given yet."
        : e.compacted < 1
          ? `The store rows are those of the compacted buckets (${fmt(100 * e.compacted, 0)} % of ` +
            "the stored readings); the others wait, raw, until their bucket closes."
          : "Every stored reading is compacted.";
      set("efficiency-note",
        `Measured on ${fmtInt(stats.readings)} readings received and the ${fmtInt(e.sample)} most recent stored. ` +
        "Zeal's wire figure includes its headers and timestamps; the JSON row includes a timestamp; " +
        "the float64 row is the value alone. The segments row is the stored readings alone; the " +
        "database row is this stream's share of everything the database holds for it (devices, " +
        `the privacy ledger, each device's sequence state for exactly-once, indexes), per stored reading. ${compaction}`);
      set("efficiency-paper-note",
        `Compression ratio CR = ${fmt(e.compression_ratio_cr, 4)} (Eq. 34), transmission ratio ` +
        `TR = ${fmt(e.transmission_ratio_tr, 4)} (Eq. 27): the paper sends ${fmt(e.paper_wire_bits, 0)} ` +
        "bits per value before headers and timestamps.");
    }
    const horizons = [["last_7_days", "the last 7 days"], ["last_30_days", "the last 30 days"],
      ["last_365_days", "the last 365 days"], ["since_first_seen", "since first seen"]];
    const accounts = stats.device_accounts || {};
    accountsBody.replaceChildren(...(Object.keys(accounts).length
      ? horizons.filter(([key]) => key in accounts).map(([key, label]) => el("tr", { id: `account-${key}` },
        el("td", { text: label }),
        ...["median", "p90", "max"].map((q) => el("td", { class: "num", text: fmt(accounts[key][q], 2) }))))
      : [el("tr", {}, el("td", { colspan: 4, text: "No device yet." }))]));
    const reasons = Object.entries(stats.rejects).sort((x, y) => y[1] - x[1]);
    const row = (reason, count, note, id) => el("tr", { id },
      el("td", {}, reason, note ? el("span", { class: "muted", text: ` (${note})` }) : null),
      el("td", { class: "num", text: fmtInt(count) }));
    rejectsBody.replaceChildren(
      ...(reasons.length
        ? reasons.map(([reason, count]) => row(reason, count, "rejected: nothing stored"))
        : [el("tr", {}, el("td", { colspan: 2, text: "No message rejected." }))]),
      row("duplicate", stats.duplicates, "received again, already stored: dropped", "row-duplicates"),
      row("sequence_reset", stats.sequence_resets,
        "a device's outbox started again: stored, nothing lost", "row-sequence-resets"),
      row("missing", stats.missing,
        "sequence numbers that never arrived, counted once they no longer can", "row-missing"),
      row("late", stats.late, "stored after a later batch of their device", "row-late"));
  }

  function changed() {
    keepInUrl();
    runRefresh();
  }

  windowSelect.addEventListener("change", () => {
    state.window = windowSelect.value;
    customBox.hidden = state.window !== "custom";
    if (state.window === "custom" && !state.start) {
      state.start = new Date(Date.now() - 3600000).toISOString().slice(0, 19);
      startInput.value = state.start;
    }
    changed();
  });
  // A datetime-local input drops ":00" seconds from its value; the window keeps them, so the
  // address and the figures name the same instant whatever the seconds are.
  const withSeconds = (value) => (value.length === 16 ? `${value}:00` : value);
  startInput.addEventListener("change", () => { state.start = withSeconds(startInput.value); changed(); });
  endInput.addEventListener("change", () => { state.end = withSeconds(endInput.value); changed(); });
  intervalSelect.addEventListener("change", () => { state.interval = intervalSelect.value; changed(); });
  groupSelect.addEventListener("change", () => { state.group = groupSelect.value; changed(); });
  quantileSelect.addEventListener("change", () => { state.quantile = quantileSelect.value; changed(); });
  distLevels.addEventListener("change", () => { state.quantiles = distLevels.value.replace(/\s+/g, ""); changed(); });
  distAbove.addEventListener("change", () => { state.above = distAbove.value; changed(); });
  groupA.addEventListener("change", () => { state.a = groupA.value; changed(); });
  groupB.addEventListener("change", () => { state.b = groupB.value; changed(); });
  methodSelect.addEventListener("change", () => {
    state.method = methodSelect.value;
    changed();
  });
  let planTimer = null;
  const planSoon = () => { clearTimeout(planTimer); planTimer = setTimeout(() => loadPlan(), 250); };
  planForm.addEventListener("input", planSoon);
  planForm.addEventListener("change", planSoon);
  planForm.addEventListener("submit", (event) => { event.preventDefault(); loadPlan(); });
  planBox.addEventListener("toggle", () => { if (planBox.open) loadPlan(); });
  customBox.hidden = state.window !== "custom";
  drawDeviceHead();

  return {
    async refresh() {
      if (!stream) {
        stream = await api(streamPath(name));
        fillIntervals();
        methodSelect.value = state.method;
        const range = stream.upper - stream.lower;  // a first guess the operator replaces
        document.getElementById("plan-between").value = String(Number((range / 10).toPrecision(3)));
        document.getElementById("plan-within").value = String(Number((range / 5).toPrecision(3)));
        showParams();
      }
      groups = await api(`${streamPath(name)}/groups`);
      fillGroups();
      quantileSelect.value = state.quantile;
      await Promise.all([loadWindow(), loadDistribution(), loadCompare(), loadStats(),
        loadSenders(), state.editing ? null : loadDevices()]);
      main.dataset.ready = String(Date.now());
    },
  };
}

// The chart: our own SVG. Bands are clipped to the plot, whose height is kept near the
// stream's range so one wide guaranteed band cannot flatten the rest.

function niceTicks(lo, hi, count) {
  const span = hi - lo;
  const raw = span / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || raw;
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
  return ticks;
}

function timeTicks(from, to) {
  const span = (to - from) / 1000;
  const step = NICE_SECONDS.find((s) => span / s <= 7) || 604800;
  const ticks = [];
  for (let t = Math.ceil(from / 1000 / step) * step; t * 1000 <= to; t += step) ticks.push(t * 1000);
  const label = (ms) => {
    const iso = new Date(ms).toISOString();
    if (step >= 86400) return iso.slice(5, 10);
    if (step >= 60) return iso.slice(11, 16);
    return iso.slice(11, 19);
  };
  return ticks.map((t) => [t, label(t)]);
}

function drawChart(points, stream, interval, name, group, quantiles = []) {
  const W = 900;
  const H = 320;
  const m = { l: 58, r: 14, t: stream.unit ? 24 : 12, b: 30 };
  const pts = points.filter((p) => p.estimate);
  const label = `Debiased average of ${name}${stream.unit ? ` in ${stream.unit}` : ""}` +
    `${group ? ` for ${group}` : ""} per ${describeDuration(interval)}, ` +
    `${pts.length} points, with the 95 % normal interval and the guaranteed interval`;
  const root = svgEl("svg", { class: "chart", id: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": label, "data-points": pts.length });
  if (!pts.length) {
    root.append(svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, "No readings in this window"));
    return root;
  }
  const x0 = new Date(pts[0].start).getTime();
  const x1 = new Date(pts[pts.length - 1].end).getTime();
  // The axis covers every average and the bands as far as a quarter of the stream's range
  // beyond it; wider bands (few readings in an interval) are clipped at the plot's edge,
  // so one of them cannot flatten the rest. Their exact values are in the tooltips.
  const range = stream.upper - stream.lower;
  const means = pts.map((p) => p.estimate.mean);
  const bandLo = Math.min(...pts.map((p) => Math.min(p.estimate.guaranteed[0], p.estimate.ci[0])));
  const bandHi = Math.max(...pts.map((p) => Math.max(p.estimate.guaranteed[1], p.estimate.ci[1])));
  const qs = quantiles.map((p) => p.quantile.value);
  let lo = Math.min(...means, ...qs, Math.max(bandLo, stream.lower - 0.25 * range));
  let hi = Math.max(...means, ...qs, Math.min(bandHi, stream.upper + 0.25 * range));
  if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
  const pad = (hi - lo) * 0.04;
  lo -= pad; hi += pad;
  root.dataset.lo = String(lo);
  root.dataset.hi = String(hi);
  const px = (t) => m.l + ((t - x0) / Math.max(1, x1 - x0)) * (W - m.l - m.r);
  const py = (v) => m.t + (1 - (v - lo) / (hi - lo)) * (H - m.t - m.b);
  const mid = (p) => (new Date(p.start).getTime() + new Date(p.end).getTime()) / 2;

  const clipId = "plot-clip";
  root.append(svgEl("defs", {}, svgEl("clipPath", { id: clipId },
    svgEl("rect", { x: m.l, y: m.t, width: W - m.l - m.r, height: H - m.t - m.b }))));
  const grid = svgEl("g", { class: "grid" });
  const axis = svgEl("g", { class: "axis" });
  for (const v of niceTicks(lo, hi, 6)) {
    grid.append(svgEl("line", { x1: m.l, x2: W - m.r, y1: py(v), y2: py(v) }));
    axis.append(svgEl("text", { x: m.l - 6, y: py(v) + 4, "text-anchor": "end" }, String(v)));
  }
  for (const [t, text] of timeTicks(x0, x1)) {
    grid.append(svgEl("line", { x1: px(t), x2: px(t), y1: m.t, y2: H - m.b }));
    const anchor = px(t) > W - m.r - 30 ? "end" : px(t) < m.l + 30 ? "start" : "middle";
    axis.append(svgEl("text", { x: px(t), y: H - m.b + 16, "text-anchor": anchor }, text));
  }
  axis.append(svgEl("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }),
    svgEl("line", { x1: m.l, x2: m.l, y1: m.t, y2: H - m.b }));
  if (stream.unit) {
    axis.append(svgEl("text", { x: m.l - 6, y: 12, "text-anchor": "end", class: "unit",
      id: "chart-unit" }, stream.unit));
  }
  root.append(grid, axis);

  // Runs of adjacent intervals are drawn joined; a gap (no readings) breaks them.
  const runs = [];
  for (const p of pts) {
    const last = runs[runs.length - 1];
    if (last && last[last.length - 1].end === p.start) last.push(p);
    else runs.push([p]);
  }
  const band = (run, which) => {
    const xs = run.length === 1
      ? [[new Date(run[0].start).getTime(), run[0]], [new Date(run[0].end).getTime(), run[0]]]
      : run.map((p) => [mid(p), p]);
    const top = xs.map(([t, p]) => `${px(t).toFixed(1)},${py(p.estimate[which][1]).toFixed(1)}`);
    const bottom = xs.slice().reverse().map(([t, p]) => `${px(t).toFixed(1)},${py(p.estimate[which][0]).toFixed(1)}`);
    return `M${top.join("L")}L${bottom.join("L")}Z`;
  };
  const plot = svgEl("g", { "clip-path": `url(#${clipId})` });
  plot.append(svgEl("path", { class: "band-guaranteed", d: runs.map((r) => band(r, "guaranteed")).join(" ") },
    svgEl("title", {}, "guaranteed interval")));
  plot.append(svgEl("path", { class: "band-normal", d: runs.map((r) => band(r, "ci")).join(" ") },
    svgEl("title", {}, "95 % normal-approximation interval")));
  plot.append(svgEl("path", { class: "mean-line",
    d: runs.map((r) => `M${r.map((p) => `${px(mid(p)).toFixed(1)},${py(p.estimate.mean).toFixed(1)}`).join("L")}`).join(" ") }));
  for (const p of pts) {
    const e = p.estimate;
    plot.append(svgEl("circle", { class: "point", cx: px(mid(p)), cy: py(e.mean), r: pts.length > 200 ? 1.5 : 3,
      "data-start": p.start, "data-mean": String(e.mean), "data-n": p.n },
    svgEl("title", {}, `${fmtTime(p.start)}: average ${fmt(e.mean)} from ${fmtInt(p.n)} readings; ` +
      `95 % ${fmt(e.ci[0])} – ${fmt(e.ci[1])}; guaranteed ${fmt(e.guaranteed[0])} – ${fmt(e.guaranteed[1])}`)));
  }
  if (quantiles.length) {
    const at = (p) => `${px(mid(p)).toFixed(1)},${py(p.quantile.value).toFixed(1)}`;
    plot.append(svgEl("path", { class: "quantile-line", d: `M${quantiles.map(at).join("L")}` }));
    for (const p of quantiles) {
      const q = p.quantile;
      plot.append(svgEl("circle", { class: "quantile-point", cx: px(mid(p)), cy: py(q.value), r: 3,
        "data-start": p.start, "data-value": String(q.value) },
      svgEl("title", {}, `${fmtTime(p.start)}: ${fmtQ(q.q)} quantile ${fmt(q.value)}` +
        (q.low === null ? " (no interval: too few devices)" : `, 95 % ${fmt(q.low)} – ${fmt(q.high)}`))));
    }
  }
  root.append(plot);
  return root;
}

// The histogram of a window (GET …/distribution): a bar per bin, the quantiles marked with
// their intervals shaded, the threshold as a dashed line.

function drawHistogram(body, stream, name) {
  const W = 900;
  const H = 260;
  const m = { l: 58, r: 14, t: 16, b: 30 };
  const edges = body.edges;
  const top = Math.max(...body.probabilities) * 1.08 || 1;
  const root = svgEl("svg", { class: "chart", id: "histogram", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `Histogram of ${name}'s readings in ${body.probabilities.length} bins, with the ` +
      `${body.quantiles.map((q) => fmtQ(q.q)).join(", ")} quantiles marked`,
    "data-bins": body.probabilities.length });
  const px = (v) => m.l + ((v - stream.lower) / (stream.upper - stream.lower)) * (W - m.l - m.r);
  const py = (share) => m.t + (1 - share / top) * (H - m.t - m.b);
  const grid = svgEl("g", { class: "grid" });
  const axis = svgEl("g", { class: "axis" });
  for (const v of niceTicks(0, top, 4)) {
    grid.append(svgEl("line", { x1: m.l, x2: W - m.r, y1: py(v), y2: py(v) }));
    axis.append(svgEl("text", { x: m.l - 6, y: py(v) + 4, "text-anchor": "end" }, `${Math.round(v * 1000) / 10} %`));
  }
  for (const v of niceTicks(stream.lower, stream.upper, 8)) {
    axis.append(svgEl("text", { x: px(v), y: H - m.b + 16, "text-anchor": "middle" }, String(v)));
  }
  axis.append(svgEl("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
  root.append(grid, axis);
  body.probabilities.forEach((share, i) => {
    const x = px(edges[i]);
    root.append(svgEl("rect", { class: "bar", x: x + 0.5, y: py(share), width: Math.max(0.5, px(edges[i + 1]) - x - 1),
      height: py(0) - py(share), "data-share": String(share) },
    svgEl("title", {}, `${fmt(edges[i])} – ${fmt(edges[i + 1])}: ${fmtShare(share)} of the readings`)));
  });
  for (const q of body.quantiles) {
    if (q.low !== null) {
      root.append(svgEl("rect", { class: "quantile-interval", x: px(q.low), y: m.t,
        width: Math.max(1, px(q.high) - px(q.low)), height: H - m.t - m.b }));
    }
    root.append(svgEl("line", { class: "quantile-mark", x1: px(q.value), x2: px(q.value), y1: m.t, y2: H - m.b,
      "data-q": String(q.q), "data-value": String(q.value) },
    svgEl("title", {}, `${fmtQ(q.q)} quantile ${fmt(q.value)}`)));
  }
  // Their labels, left to right, each on the first line where it does not touch the one
  // before it (close quantiles, "90 %" and "95 %", would otherwise print over each other).
  const ends = [];
  for (const q of [...body.quantiles].sort((x, y) => x.value - y.value)) {
    const x = px(q.value) + 3;
    const width = 7 * fmtQ(q.q).length;
    let line = ends.findIndex((end) => end + 4 <= x);
    if (line === -1) line = ends.push(-Infinity) - 1;
    ends[line] = x + width;
    root.append(svgEl("text", { class: "quantile-label", x, y: m.t + 10 + 13 * line, "data-q": String(q.q) }, fmtQ(q.q)));
  }
  if (body.above) {
    root.append(svgEl("line", { class: "threshold", x1: px(body.above.threshold), x2: px(body.above.threshold),
      y1: m.t, y2: H - m.b }));
  }
  return root;
}

// New stream: parameters previewed by the server before anything is saved.

function createView(main) {
  const field = (id, label, attrs) => el("label", { for: id }, label, el("input", { id, name: id, ...attrs }));
  const form = el("form", { class: "form", id: "create-form", novalidate: true },
    field("name", "Name", { required: true, pattern: "[A-Za-z0-9_.\\-]{1,64}", placeholder: "room-temps" }),
    field("lower", "Lower end of the range", { type: "number", step: "any", required: true, value: "0" }),
    field("upper", "Upper end of the range", { type: "number", step: "any", required: true, value: "110" }),
    field("epsilon", "ε per reading", { type: "number", step: "any", min: "0", required: true, value: "1" }),
    field("payload_bits", "Payload bits (blank: library default)", { type: "number", min: "2", max: "28", step: "1" }),
    field("bucket_seconds", "Bucket (seconds)", { type: "number", min: "1", max: "86400", step: "1", value: "60" }),
    field("unit", "Unit (e.g. degF, kWh)", { maxlength: "32", placeholder: "degF" }),
    field("max_epsilon_per_day", "Privacy policy: ε per device per UTC day", { type: "number", step: "any", min: "0", required: true, value: "8" }),
    field("reading_every", "Seconds between a device's readings (for the preview)", { type: "number", step: "any", min: "0.001", placeholder: "60" }),
    field("preview_n", "Readings in an average (for the preview)", { type: "number", min: "1", step: "1", value: "10000" }),
    field("plan_devices", "Devices in the fleet (for the planner)", { type: "number", min: "1", step: "1", placeholder: "500" }),
    field("plan_interval", "Window of an average, seconds (for the planner)", { type: "number", min: "1", step: "1", placeholder: "3600" }),
    field("plan_with", "Other streams of the same device, comma-separated (for the planner: one cap across them)", { placeholder: "humidity,co2" }),
    field("plan_shares", "Shares of the device cap, this stream's first (blank: even)", { placeholder: "2,1,1" }),
    el("label", { for: "description", class: "wide" }, "Description",
      el("input", { id: "description", name: "description", maxlength: "500" })),
    el("div", { class: "wide" },
      el("button", { type: "submit", class: "primary", id: "create-button", text: "Create stream" }),
      el("span", { class: "muted", id: "create-token-note", text: " Parameters never change once created." })));
  const preview = el("dl", { class: "params", id: "preview" });
  const previewDetails = el("dl", { class: "params", id: "preview-details" });
  const previewNote = el("p", { class: "muted", id: "preview-note", "aria-live": "polite" });
  const message = el("div", { class: "message", id: "create-message", role: "status", "aria-live": "polite" });
  main.append(
    el("h1", { text: "New stream" }),
    el("div", { class: "grid2" },
      el("section", { class: "card", "aria-labelledby": "form-title" },
        el("h2", { id: "form-title", text: "Parameters" }), form, message),
      el("section", { class: "card", "aria-labelledby": "preview-title" },
        el("h2", { id: "preview-title", text: "What these parameters give (preview)" }), preview, previewNote,
        el("details", { id: "preview-mechanism" },
          el("summary", { text: "Mechanism details" }), previewDetails))));

  const value = (id) => document.getElementById(id).value.trim();
  let timer = null;
  let asked = 0;
  // What this server requires to create a stream, as it says (GET /server).
  api(`${API}/server`).then((s) => {
    const needs = s.operator_token_required
      ? " Needs the operator token (enter it at the top)."
      : " This server takes writes without a token (development mode).";
    document.getElementById("create-token-note").textContent = `${needs} Parameters never change once created.`;
  }).catch(() => {});

  async function updatePreview() {
    const mine = ++asked;
    const params = { lower: value("lower"), upper: value("upper"), epsilon: value("epsilon"),
      payload_bits: value("payload_bits"), n: value("preview_n") || 10000,
      max_epsilon_per_day: value("max_epsilon_per_day"), reading_every_seconds: value("reading_every") };
    // The fleet planner needs all three: devices, a reading's spacing and the window.
    if (value("plan_devices") && value("plan_interval") && value("reading_every")) {
      Object.assign(params, { devices: value("plan_devices"), interval_seconds: value("plan_interval") });
      if (value("plan_with")) Object.assign(params, { with_streams: value("plan_with"), shares: value("plan_shares") });
    }
    try {
      const p = await api(`${API}/preview${query(params)}`);
      if (mine !== asked) return;
      const internals = [
        ["Payload bits", `${p.payload_bits} sent per reading`],
        ["Shared bits", `${p.shared_bits} (the same in every privatized value: never sent)`],
        ["Abar", p.abar.toExponential(6)],
        ["C", p.C.toFixed(4)],
        ["Grid step", p.grid_step.toPrecision(6)],
        ["Transmission ratio TR (paper Eq. 27)", p.transmission_ratio.toFixed(4)],
      ];
      const rows = [
        ["Realized ε", p.realized_epsilon === null ? "–" : p.realized_epsilon.toPrecision(12)],
        [`Standard error, ${fmtInt(p.n)} readings`, p.std_error === null ? "beyond float64" : `≤ ${p.std_error.toPrecision(4)}`],
        [`Guaranteed ±, ${fmtInt(p.n)} readings`, p.guaranteed_half_width === null ? "beyond float64"
          : `${p.guaranteed_half_width.toPrecision(4)} (${Math.round(p.confidence * 100)} %)`],
        ["Readings per device per day (policy)", fmtInt(p.readings_per_day)],
        ["… and per UTC hour", fmtInt(p.readings_per_hour)],
      ];
      if (p.epsilon_per_day !== null) {
        rows.push(["ε per device per day at that rate",
          `${fmt(p.epsilon_per_day, 2)} (${p.within_policy ? "within the policy" : "over the policy: the excess is skipped"})`]);
        rows.push(["Cap that skips readings", CAP_NAMES[p.binding] || p.binding]);
      }
      for (const [plan, label] of [[p.windows, "this ε"], [p.best, "the best ε"]]) {
        if (!plan) continue;
        const share = (x) => `${fmt(100 * x, 1)} %`;
        rows.push(
          [`Planner at ${label}`, `ε ${fmt(plan.epsilon, 6)}: ${fmtInt(plan.readings_per_day)} a day, ${fmtInt(plan.readings_per_hour)} an hour`],
          ["… windows no device fills", share(plan.fleet_empty_share)],
          ["… a device's readings per window", `${fmt(plan.readings_per_window[1], 2)} (${fmt(plan.readings_per_window[0], 2)} – ${fmt(plan.readings_per_window[2], 2)})`],
          ["… standard error of a window's average", plan.std_error === null ? "no window has a reading" : plan.std_error.toPrecision(4)],
          ["… guaranteed ± of the sparsest window", plan.guaranteed_half_width === null ? "–" : plan.guaranteed_half_width.toPrecision(4)],
        );
        if (label === "this ε") rows.push(["… a reading every (s) fills every hour", fmt(plan.even_reading_every, 0)]);
      }
      if (p.device) {  // GET /preview with with_streams: the device's streams under one cap
        const cap = p.device.device_max_epsilon_per_day;
        rows.push(["Device cap across its streams", cap === null ? "none" :
          `ε ${fmt(cap, 6)} a day; at most ${fmt(p.device.spent_per_day, 6)} spent`]);
        for (const s of p.device.streams) {
          const se = s.windows.std_error === null ? "no window has a reading" : s.windows.std_error.toPrecision(4);
          rows.push([`… ${s.stream}`, s.readings_per_day === null ? `no policy; standard error ${se}` :
            `share ε ${fmt(s.share_epsilon, 6)}: ${fmtInt(s.readings_per_day)} a day (${s.binds} binds), standard error ${se}`]);
        }
      }
      preview.replaceChildren(...pairs(rows));
      previewDetails.replaceChildren(...pairs(internals));
      preview.dataset.payloadBits = String(p.payload_bits);
      previewNote.textContent = "The standard error is the worst case over all readings in the range.";
      previewNote.classList.remove("error");
    } catch (error) {
      if (mine !== asked) return;
      preview.replaceChildren();
      previewDetails.replaceChildren();
      previewNote.textContent = error.message;
    }
  }

  form.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(updatePreview, 250);
  });
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    message.className = "message";
    message.textContent = "Creating…";
    const body = {
      name: value("name"),
      lower: Number(value("lower")),
      upper: Number(value("upper")),
      epsilon: Number(value("epsilon")),
      max_epsilon_per_day: Number(value("max_epsilon_per_day")),
      bucket_seconds: Number(value("bucket_seconds") || 60),
      description: value("description"),
      unit: value("unit"),
    };
    if (value("payload_bits")) body.payload_bits = Number(value("payload_bits"));
    try {
      const created = await api(`${API}/streams`, { method: "POST", body });
      message.className = "message ok";
      message.replaceChildren(`Stream ${created.name} created (${created.payload_bits} payload bits). `,
        el("a", { href: `#/stream/${encodeURIComponent(created.name)}`, text: "Open it" }), ".");
    } catch (error) {
      message.className = "message error";
      message.setAttribute("role", "alert");
      message.textContent = `Not created: ${error.message}`;
    }
  });
  return { refresh: updatePreview, manual: true };
}

// -- start -------------------------------------------------------------------------------------

function showTokenState() {
  set("token-state", token() ? "token set for this tab" : "no token");
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token");
    sessionStorage.setItem("zeal-token", input.value.trim());
    input.value = "";
    showTokenState();
    runRefresh();
  });
  document.getElementById("token-clear").addEventListener("click", () => {
    sessionStorage.removeItem("zeal-token");
    showTokenState();
    runRefresh();
  });
  showTokenState();
  window.addEventListener("hashchange", route);
  setInterval(() => {
    if (document.getElementById("auto-refresh").checked && current && !current.manual) runRefresh();
  }, REFRESH_MS);
  route();
});
