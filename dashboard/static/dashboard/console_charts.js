/* The operator console's charts (templates/admin/console_charts.html): the last hour from
 * /admin/console/series.json (dashboard.selectors.console_series), drawn with plotly.js.
 *
 * The first call reads the whole hour; each poll after it asks only for the points from a little before the
 * last one it has (`since`: the current bucket and the rolling TTFT window change until they close), merges
 * them by time and drops what left the hour. Times are drawn in the reader's time zone.
 */
(function () {
  "use strict";
  const root = document.getElementById("console-charts");
  if (!root) return;
  const url = root.dataset.seriesUrl;
  const refreshMs = Number(root.dataset.refreshMs) || 3000;
  const config = {displaylogo: false, responsive: true, displayModeBar: false};
  const points = new Map();  // bucket start (s) -> point
  const events = new Map();  // minute start (s) -> {errors, refusals}
  let now = null;
  let windowS = 3600;
  let overlap = 60;

  function stamp(seconds) {
    const d = new Date(seconds * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
      `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function merge(payload) {
    now = payload.now;
    windowS = payload.window_s;
    overlap = 60 + payload.bucket_s;
    for (const point of payload.points) points.set(point.t, point);
    for (const minute of payload.events) events.set(minute.t, minute);
    for (const t of points.keys()) if (t < now - windowS) points.delete(t);
    for (const t of events.keys()) if (t < now - windowS - 60) events.delete(t);
  }

  function sorted(map) {
    return [...map.keys()].sort((a, b) => a - b).map((t) => map.get(t));
  }

  function line(name, xs, ys, extra) {
    return Object.assign({type: "scatter", mode: "lines", name, x: xs, y: ys, connectgaps: false,
                          line: {width: 1.5}}, extra || {});
  }

  function layout(title, yaxis) {
    return {
      title: {text: title, font: {size: 13}, x: 0.02, xanchor: "left"},
      margin: {l: 48, r: 12, t: 30, b: 28}, height: 228, showlegend: true,
      legend: {orientation: "h", y: -0.22, font: {size: 10}},
      xaxis: {type: "date", range: [stamp(now - windowS), stamp(now)], tickformat: "%H:%M", tickangle: 0,
              nticks: 7},
      yaxis: Object.assign({rangemode: "tozero", exponentformat: "none", automargin: true}, yaxis || {}),
    };
  }

  function keysOf(list, pick) {
    const names = new Set();
    for (const item of list) for (const name of Object.keys(pick(item) || {})) names.add(name);
    return [...names].sort();
  }

  function figures() {
    const list = sorted(points);
    const xs = list.map((p) => stamp(p.t));
    const figs = {};
    figs["chart-rps"] = {data: [line("requests/s", xs, list.map((p) => p.requests_per_s))],
                         layout: layout("Requests per second (finished)")};
    figs["chart-ttft"] = {data: [line("p50", xs, list.map((p) => p.ttft_p50_s)),
                                 line("p95", xs, list.map((p) => p.ttft_p95_s))],
                          layout: layout("Time to first token (s, last minute)")};
    const tiers = keysOf(list, (p) => p.queue_depth);
    const depth = (tier) => list.map((p) => (p.queue_depth ? (p.queue_depth[tier] || 0) : null));
    figs["chart-queue"] = {
      data: tiers.length ? tiers.map((tier) => line(tier, xs, depth(tier), {line: {shape: "hv", width: 1.5}}))
        : [line("queued", xs, list.map((p) => (p.queue_depth ? 0 : null)), {line: {shape: "hv", width: 1.5}})],
      layout: layout("Queue depth per tier")};
    const minutes = sorted(events);
    const mx = minutes.map((m) => stamp(m.t));
    const bars = [];
    for (const [kind, prefix] of [["errors", "error "], ["refusals", "refused "]]) {
      for (const label of keysOf(minutes, (m) => m[kind])) {
        bars.push({type: "bar", name: prefix + label, x: mx, y: minutes.map((m) => m[kind][label] || 0)});
      }
    }
    figs["chart-events"] = {
      data: bars.length ? bars : [line("none", mx, minutes.map(() => 0))],
      layout: Object.assign(layout("Errors and refusals per minute"), {barmode: "stack"})};
    const workers = keysOf(list, (p) => p.workers);
    const perWorker = (key) => workers.map((w) => line(w, xs, list.map((p) => (p.workers[w] ? p.workers[w][key] : null))));
    figs["chart-kv"] = {data: perWorker("kv_usage"),
                        layout: layout("KV-cache use per worker", {range: [0, 1], tickformat: ".0%"})};
    figs["chart-tok-s"] = {data: perWorker("tok_s"), layout: layout("Tokens per second per worker")};
    return figs;
  }

  function draw() {
    const figs = figures();
    return Promise.all(Object.entries(figs).map(([id, fig]) => Plotly.react(id, fig.data, fig.layout, config)))
      .then(() => { root.dataset.drawnAt = String(now); });
  }

  async function refresh() {
    try {
      if (!document.hidden || now === null) {
        const since = now === null ? "" : `?since=${Math.floor(now - overlap)}`;
        const response = await fetch(url + since, {credentials: "same-origin"});
        if (response.ok) {
          merge(await response.json());
          await draw();
        }
      }
    } catch (error) {
      console.warn("console charts: refresh failed", error);
    } finally {
      setTimeout(refresh, refreshMs);
    }
  }

  refresh();
})();
