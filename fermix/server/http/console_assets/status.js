// Status: the server's status document, polled; rates, latency and queues charted over the
// last minutes on a canvas (no inline style: CSP), as text too for a screen reader (W1, N7).

import { button, el, fill, table } from "./dom.js";

const POLL_MS = 2000;
const KEEP = 150; // five minutes of samples

const history = [];

function draw(canvas, series) {
  const g = canvas.getContext("2d");
  const w = (canvas.width = canvas.clientWidth || 600);
  const h = (canvas.height = canvas.clientHeight || 128);
  g.clearRect(0, 0, w, h);
  const colours = ["#0a58ca", "#116329", "#b42318", "#8250df"];
  const top = Math.max(1, ...series.flatMap(([, values]) => values));
  series.forEach(([, values], i) => {
    g.strokeStyle = colours[i % colours.length];
    g.fillStyle = g.strokeStyle;
    g.lineWidth = 2;
    g.beginPath();
    const step = w / Math.max(1, KEEP - 1);
    values.forEach((v, x) => {
      const px = w - (values.length - 1 - x) * step - 2; // newest at the right edge
      const py = h - (v / top) * (h - 6) - 3;
      if (x === 0) g.moveTo(px, py); else g.lineTo(px, py);
      if (x === values.length - 1) g.fillRect(px - 2, py - 2, 4, 4);
    });
    g.stroke();
  });
}

/** Every scalar of the status document, nested ones as ``a.b`` (rates, latencies, queues). */
function flatten(doc, prefix = "") {
  const rows = [];
  for (const [k, v] of Object.entries(doc)) {
    if (k === "last_errors" || k === "children") continue;
    const name = prefix ? `${prefix}.${k}` : k;
    if (v !== null && typeof v === "object" && !Array.isArray(v)) rows.push(...flatten(v, name));
    else rows.push([name, v === null ? "none" : String(v)]);
  }
  return rows;
}

export async function render(root, ctx) {
  const now = el("div", { id: "status-now" });
  const rates = el("canvas", { id: "rates", role: "img", "aria-label": "Requests and appends per second" });
  const latency = el("canvas", { id: "latency", role: "img",
    "aria-label": "Append and compose latency in milliseconds, median and 99th percentile" });
  const queues = el("canvas", { id: "queues", role: "img", "aria-label": "Reviews and compactions queued" });
  const checks = el("div", { id: "doctor" });
  const runChecks = button("Run doctor's checks", () => ctx.attempt(async () => {
    fill(checks, el("p", { class: "muted" }, "Checking..."));
    const report = await ctx.get("/console/api/doctor");
    fill(checks,
      el("p", {}, report.ok ? "Every check passed or warned." : "Some check failed."),
      table("doctor's checks", ["check", "status", "summary", "hint"],
        report.checks.map((c) => [c.name, c.status, c.summary, c.hint || ""])));
  }));
  fill(root, el("h2", {}, "Status"),
    el("h3", {}, "Requests and appends per second (blue, green)"), rates,
    el("h3", {}, "Latency over the last minute, ms: append p50, p99 (blue, green), compose p50, p99 (red, purple)"),
    latency,
    el("h3", {}, "Reviews and compactions running and queued"), queues, now,
    el("section", {}, el("h3", {}, "Doctor"), runChecks, checks));
  let stopped = false;
  const poll = async () => {
    const s = await ctx.get("/v1/status");
    history.push(s);
    while (history.length > KEEP) history.shift();
    const per = (name) => history.map((d) => (d.per_second || {})[name] || 0);
    const num = (name) => history.map((d) => d[name] || 0);
    const ms = (name, q) => history.map((d) => ((d.latency || {})[name] || {})[q] || 0);
    draw(rates, [["requests", per("requests")], ["appends", per("appends")]]);
    draw(latency, [["append p50", ms("append", "p50_ms")], ["append p99", ms("append", "p99_ms")],
                   ["compose p50", ms("compose", "p50_ms")], ["compose p99", ms("compose", "p99_ms")]]);
    draw(queues, [["reviews_queued", num("reviews_queued")], ["compactions_queued", num("compactions_queued")],
                  ["reviews_running", num("reviews_running")], ["compactions_running", num("compactions_running")]]);
    fill(now,
      table("the status document now", ["what", "value"], flatten(s)),
      el("h3", {}, "Last errors"),
      (s.last_errors || []).length === 0 ? el("p", { class: "muted" }, "None.")
        : el("ul", { class: "plain" }, s.last_errors.map((e) => el("li", {}, `${e.where}: ${e.message}`))));
  };
  await poll();
  const timer = window.setInterval(() => {
    if (!stopped) ctx.attempt(poll);
  }, POLL_MS);
  return () => {
    stopped = true;
    window.clearInterval(timer);
  };
}
