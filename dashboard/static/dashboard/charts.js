/* The dashboard's charts: draws the specs of dashboard/charts.py with plotly.js (loaded before this file).
 *
 * A spec with `day_axis` has the tenant's local days ("YYYY-MM-DD") on its x axis. Which days get a tick is
 * chosen here, from the axis' width in pixels and the width of the widest label (measured as plotly draws
 * it): every day, every 2nd, 3rd, 7th, 14th, ... day, whichever is the first whose labels fit without
 * touching. The labels are the reader's locale's short dates (Intl.DateTimeFormat), the year added where the
 * range spans two. Ticks are picked again when the window is resized.
 */
(function () {
  "use strict";
  const STEPS = [1, 2, 3, 7, 14, 28, 56, 91, 182, 364];
  const GAP_PX = 16;  // free space between two labels
  const FONT = "12px \"Open Sans\", verdana, arial, sans-serif";  // plotly's tick font
  const drawn = new Map();  // element id -> {element, spec}
  let canvas = null;

  function locale() {
    return (navigator.languages && navigator.languages[0]) || navigator.language || "en";
  }

  function dayDate(day) {
    const [year, month, date] = day.split("-").map(Number);
    return new Date(Date.UTC(year, month - 1, date));
  }

  function formats(days) {
    const years = new Set(days.map((day) => day.slice(0, 4)));
    const short = {month: "short", day: "numeric", timeZone: "UTC"};
    if (years.size > 1) short.year = "2-digit";
    return {
      short: new Intl.DateTimeFormat(locale(), short),
      long: new Intl.DateTimeFormat(locale(), {weekday: "short", year: "numeric", month: "short", day: "numeric",
                                               timeZone: "UTC"}),
    };
  }

  function textWidth(text) {
    canvas = canvas || document.createElement("canvas");
    const context = canvas.getContext("2d");
    context.font = FONT;
    return context.measureText(text).width;
  }

  /* {tickvals, ticktext, step}: the days that get a label on an axis `axisPx` wide. */
  function dayTicks(days, axisPx) {
    if (!days.length) return {tickvals: [], ticktext: [], step: 1};
    const format = formats(days).short;
    const labels = days.map((day) => format.format(dayDate(day)));
    const labelPx = Math.max(...labels.map(textWidth)) + GAP_PX;
    const perDayPx = axisPx / Math.max(1, days.length);  // bars sit one day apart
    const step = STEPS.find((s) => s * perDayPx >= labelPx) || Math.ceil(labelPx / perDayPx);
    const picked = days.map((day, i) => i).filter((i) => i % step === 0);
    return {tickvals: picked.map((i) => days[i]), ticktext: picked.map((i) => labels[i]), step};
  }

  function axisDays(spec) {
    const days = new Set();
    for (const trace of spec.data) for (const x of trace.x || []) days.add(x);
    return [...days].sort();
  }

  function axisWidth(element, layout) {
    const full = element._fullLayout;  // plotly's own figure of the axis length, once drawn
    if (full && full.xaxis && full.xaxis._length) return full.xaxis._length;
    const margin = layout.margin || {};
    return Math.max(100, element.clientWidth - (margin.l || 80) - (margin.r || 80));
  }

  function withDayAxis(element, spec) {
    const days = axisDays(spec);
    const long = formats(days).long;
    const data = spec.data.map((trace) => {
      const out = Object.assign({}, trace);
      if (out.hovertext === undefined) out.hovertext = (trace.x || []).map((day) => long.format(dayDate(day)));
      if (out.hovertemplate === undefined) out.hovertemplate = "%{hovertext}<br>%{y}<extra>%{fullData.name}</extra>";
      return out;
    });
    const ticks = dayTicks(days, axisWidth(element, spec.layout));
    const half = 12 * 3600 * 1000;
    const range = days.length ? [dayDate(days[0]).getTime() - half, dayDate(days[days.length - 1]).getTime() + half]
      : undefined;
    const xaxis = Object.assign({}, spec.layout.xaxis, {tickmode: "array", tickvals: ticks.tickvals,
                                                        ticktext: ticks.ticktext, tickangle: 0});
    if (range) xaxis.range = range.map((ms) => new Date(ms).toISOString().slice(0, 19).replace("T", " "));
    return {data, layout: Object.assign({}, spec.layout, {xaxis}), days, step: ticks.step};
  }

  function retick(element, days, step) {
    const ticks = dayTicks(days, axisWidth(element, {}));
    if (ticks.step === step) return Promise.resolve(step);
    return Plotly.relayout(element, {"xaxis.tickvals": ticks.tickvals, "xaxis.ticktext": ticks.ticktext})
      .then(() => ticks.step);
  }

  /* Draws `spec` into the element `id`; resolves once drawn (ticks fitted to the drawn axis). */
  function draw(id, spec) {
    const element = document.getElementById(id);
    const config = {displaylogo: false, responsive: true};
    if (!spec.day_axis) return Plotly.newPlot(element, spec.data, spec.layout, config);
    const figure = withDayAxis(element, spec);
    const entry = {element, days: figure.days, step: figure.step};
    drawn.set(id, entry);
    return Plotly.newPlot(element, figure.data, figure.layout, config)
      .then(() => retick(element, entry.days, entry.step))
      .then((step) => { entry.step = step; element.dataset.ticked = "1"; });
  }

  function drawAll(specs) {
    return Promise.all(Object.entries(specs).map(([id, spec]) => draw(id, spec)));
  }

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const entry of drawn.values()) {
        // after plotly's own resize (responsive), so the axis length is the new one
        setTimeout(() => retick(entry.element, entry.days, entry.step).then((step) => { entry.step = step; }), 50);
      }
    }, 150);
  });

  window.dashCharts = {draw, drawAll, dayTicks, locale};
})();
