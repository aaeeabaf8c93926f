"""The usage page's tables: per day (days with traffic one row each, each run of days without a request one
row) and per model.

The data island, the charts and the CSV keep every day; only the table a person reads folds the quiet days
(a 92-day range of a tenant that called on 5 of them is 5 rows and the gaps between them, not 92).
"""

from __future__ import annotations


def usage_table_rows(rows: list[dict]) -> list[dict]:
    """[{"row": <day row>} | {"quiet": True, "first": day, "last": day, "count": n}] in day order."""
    out: list[dict] = []
    for row in rows:
        if row["requests"]:
            out.append({"row": row})
        elif out and out[-1].get("quiet"):
            out[-1]["last"] = row["day"]
            out[-1]["count"] += 1
        else:
            out.append({"quiet": True, "first": row["day"], "last": row["day"], "count": 1})
    return out


def by_model_rows(totals: dict[str, dict[str, int]], usd) -> list[dict]:
    """The range's figures per model (model -> billing's FIGURES), most spend first: the "by model" table.
    `usd`: femto-USD -> the island's decimal string (billing.selectors.usd_str)."""
    ordered = sorted(totals.items(), key=lambda item: (-item[1]["cost_femtos"], item[0]))
    return [{"model": model, "requests": sums["requests"], "input_tokens": sums["input_tokens"],
             "cached_input_tokens": sums["cached_input_tokens"], "output_tokens": sums["output_tokens"],
             "spend_usd": usd(sums["cost_femtos"])} for model, sums in ordered]
