"""Chart specifications for plotly.js (traces and layout as plain data; the page hands them to
dashboard/static/dashboard/charts.js, which draws them). Built from the same rows as the page's JSON data
island and tables.

A spec is {"data", "layout", "day_axis"}: with `day_axis`, x holds the tenant's local days ("YYYY-MM-DD") on a
date axis, and the page picks which days get a tick (as many as fit the chart's width, never overlapping) and
writes them in the reader's locale. Money axes are dollars and cents with as many decimals as the largest amount
needs (never SI prefixes: "120μ" is not a price); rates are percentages on an axis from 0 (0 to 100 % when
there is nothing to show).
"""

from __future__ import annotations

from decimal import Decimal

_LAYOUT = {"margin": {"l": 70, "r": 20, "t": 40, "b": 40}, "height": 320, "legend": {"orientation": "h"},
           "xaxis": {"type": "date", "tickangle": 0, "automargin": True}}
MAX_PLACES = 9  # nano-dollars: below that a day's spend reads as $0.000000000


def usd_places(amounts: list[Decimal]) -> int:
    """Decimals an axis of these amounts needs: cents from a dollar up, else enough for the largest amount's
    first two significant digits (the ticks plotly picks step by a tenth of it at most)."""
    largest = max((abs(amount) for amount in amounts), default=Decimal(0))
    if not largest:
        return 2
    return min(MAX_PLACES, max(2, 1 - largest.adjusted()))


def usd_axis(amounts: list[Decimal], **extra) -> dict:
    places = usd_places(amounts)
    return {"tickprefix": "$", "tickformat": f",.{places}f", "hoverformat": f",.{places}f", "rangemode": "tozero",
            "exponentformat": "none", **extra}


def _layout(title: str, y_title: str, yaxis: dict | None = None, **extra) -> dict:
    return {**_LAYOUT, "title": {"text": title},
            "yaxis": {"title": {"text": y_title}, "rangemode": "tozero", **(yaxis or {})}, **extra}


def _spend(rows: list[dict]) -> tuple[list[Decimal], dict]:
    amounts = [Decimal(row["spend_usd"]) for row in rows]
    trace = {"type": "bar", "name": "spend (USD)", "x": [row["day"] for row in rows],
             "y": [float(amount) for amount in amounts], "customdata": [row["spend_usd"] for row in rows],
             "hovertemplate": "%{hovertext}<br>$%{customdata}<extra>spend</extra>"}
    return amounts, trace


def usage_charts(rows: list[dict]) -> dict[str, dict]:
    """element id -> {"data": [...], "layout": {...}, "day_axis": True} for the usage page."""
    days = [row["day"] for row in rows]
    tokens = [
        {"type": "bar", "name": label, "x": days, "y": [row[field] for row in rows]}
        for field, label in (("input_tokens", "uncached input"), ("cached_input_tokens", "cached input"),
                             ("output_tokens", "output"))
    ]
    amounts, spend = _spend(rows)
    ttft = [{"type": "scatter", "mode": "lines+markers", "name": name, "x": days,
             "y": [row[field] for row in rows]} for field, name in (("ttft_p50_s", "p50"), ("ttft_p95_s", "p95"))]
    rates = [row["error_rate"] for row in rows]
    errors = [{"type": "bar", "name": "error rate", "x": days, "y": rates}]
    token_axis = {} if any(trace_y for trace in tokens for trace_y in trace["y"]) else {"range": [0, 10]}  # not 0.2
    error_axis = {"tickformat": ".0%", "hoverformat": ".2%"}
    if not any(rates):  # nothing to scale to: the whole 0-100 % (plotly's own pick is -100 % to 100 %)
        error_axis["range"] = [0, 1]
    charts = {
        "chart-tokens": {"data": tokens, "layout": _layout("Tokens per day", "tokens", token_axis, barmode="stack")},
        "chart-spend": {"data": [spend], "layout": _layout("Spend per day", "USD", usd_axis(amounts))},
        "chart-ttft": {"data": ttft, "layout": _layout("Time to first token", "seconds",
                                                       {"exponentformat": "none"})},
        "chart-errors": {"data": errors, "layout": _layout("Error rate", "share of requests", error_axis)},
    }
    return {chart_id: {**spec, "day_axis": True} for chart_id, spec in charts.items()}


def spend_by_model_chart(days: list[str], spend: dict[str, list[str]]) -> dict:
    """Spend per day stacked by model (OpenAI's usage page's picture). `spend`: model -> the day's spend as
    the island's decimal strings, one per day of `days`."""
    amounts = [sum((Decimal(v) for v in values), Decimal(0)) for values in zip(*spend.values())]
    traces = [{"type": "bar", "name": model, "x": days, "y": [float(Decimal(v)) for v in values],
               "customdata": values, "hovertemplate": "%{hovertext}<br>$%{customdata}<extra>%{fullData.name}</extra>"}
              for model, values in spend.items()]
    layout = _layout("Spend per day by model", "USD", usd_axis(amounts), barmode="stack")
    return {"data": traces, "layout": layout, "day_axis": True}


def overview_chart(rows: list[dict]) -> dict:
    """The overview's chart: spend per day (bars, dollars on the left) and tokens per day (a line, on the
    right), for the days of the period so far. Rows: {"day", "spend_usd", "tokens"}."""
    amounts, spend = _spend(rows)
    tokens = {"type": "scatter", "mode": "lines+markers", "name": "tokens", "yaxis": "y2",
              "x": [row["day"] for row in rows], "y": [row["tokens"] for row in rows]}
    layout = _layout("Spend and tokens per day", "USD", usd_axis(amounts), height=300)
    layout["yaxis2"] = {"title": {"text": "tokens"}, "overlaying": "y", "side": "right", "rangemode": "tozero",
                        "showgrid": False, "tickmode": "auto"}
    layout["margin"] = {**layout["margin"], "r": 70}
    return {"data": [spend, tokens], "layout": layout, "day_axis": True}
