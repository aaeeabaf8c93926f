"""Chart specifications for plotly.js (traces and layout as plain data; the page hands them to
Plotly.newPlot). Built from the same rows as the page's JSON data island and tables."""

from __future__ import annotations

from decimal import Decimal

_LAYOUT = {"margin": {"l": 60, "r": 20, "t": 40, "b": 40}, "height": 320, "legend": {"orientation": "h"},
           "xaxis": {"type": "category"}}


def _layout(title: str, y_title: str, **extra) -> dict:
    return {**_LAYOUT, "title": {"text": title}, "yaxis": {"title": {"text": y_title}}, **extra}


def usage_charts(rows: list[dict]) -> dict[str, dict]:
    """element id -> {"data": [...], "layout": {...}} for the usage page."""
    days = [row["day"] for row in rows]
    tokens = [
        {"type": "bar", "name": label, "x": days, "y": [row[field] for row in rows]}
        for field, label in (("input_tokens", "uncached input"), ("cached_input_tokens", "cached input"),
                             ("output_tokens", "output"))
    ]
    spend = [{"type": "bar", "name": "spend (USD)", "x": days, "y": [float(Decimal(row["spend_usd"])) for row in rows]}]
    ttft = [{"type": "scatter", "mode": "lines+markers", "name": name, "x": days,
             "y": [row[field] for row in rows]} for field, name in (("ttft_p50_s", "p50"), ("ttft_p95_s", "p95"))]
    errors = [{"type": "bar", "name": "error rate", "x": days, "y": [row["error_rate"] for row in rows]}]
    return {
        "chart-tokens": {"data": tokens, "layout": _layout("Tokens per day", "tokens", barmode="stack")},
        "chart-spend": {"data": spend, "layout": _layout("Spend per day", "USD")},
        "chart-ttft": {"data": ttft, "layout": _layout("Time to first token", "seconds")},
        "chart-errors": {"data": errors, "layout": _layout("Error rate", "share of requests",
                                                           yaxis={"tickformat": ".1%"})},
    }
