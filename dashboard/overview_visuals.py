"""What the overview draws beside its figures: the period's days as a chart, and the quota and budget as
progress bars with the budget's alert thresholds marked.

The bars' widths are display only (a float percentage); the figures printed on them are the overview's exact
ones. The thresholds are those the budget alerts use (billing.selectors.alert_percents: the
tenant's own, else the platform's); the token quota has no alerts, only its limit (requests beyond it are
refused), which both bars mark at 100 %.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from billing.selectors import alert_percents, usd_str
from dashboard.charts import overview_chart
from dashboard.selectors.overview import Overview
from tenants.models import Tenant
from tenants.services.limits import LimitScope


def overview_chart_spec(overview: Overview) -> dict:
    rows = [{"day": day.isoformat(), "spend_usd": usd_str(sums["cost_femtos"]),
             "tokens": sums["input_tokens"] + sums["cached_input_tokens"] + sums["output_tokens"]}
            for day, sums in sorted(overview.by_day.items())]
    return overview_chart(rows)


@dataclass(frozen=True, slots=True)
class Bar:
    id: str
    label: str
    used: str  # as printed
    limit: str
    percent: float  # used / limit * 100 (display only)
    thresholds: tuple[int, ...]  # alert percentages to mark (100 always: the limit)
    state: str  # "ok", "alerted" (past the first threshold below 100), "over" (at or past the limit)

    @property
    def width(self) -> float:
        """The filled part, in percent of the bar (full past the limit)."""
        return round(min(self.percent, 100.0), 2)

    @property
    def percent_text(self) -> str:
        return f"{self.percent:.1f}%"


def _bar(*, id: str, label: str, used: Decimal, limit: Decimal, used_text: str, limit_text: str,
         thresholds: tuple[int, ...]) -> Bar:
    percent = float(used * 100 / limit)
    marks = tuple(sorted({p for p in thresholds if 0 < p < 100} | {100}))
    below = [p for p in marks if p < 100]
    state = "over" if percent >= 100 else ("alerted" if below and percent >= below[0] else "ok")
    return Bar(id=id, label=label, used=used_text, limit=limit_text, percent=percent, thresholds=marks, state=state)


def allowance_bars(*, overview: Overview, tenant: Tenant) -> list[Bar]:
    """A bar for each allowance that has a limit (none without one)."""
    bars = []
    if overview.quota_limit:
        bars.append(_bar(id="bar-quota", label="Monthly tokens", used=Decimal(overview.quota_used),
                         limit=Decimal(overview.quota_limit), used_text=f"{overview.quota_used:,}",
                         limit_text=f"{overview.quota_limit:,}", thresholds=()))
    if overview.budget_limit_usd:
        bars.append(_bar(id="bar-budget", label="Monthly budget", used=overview.budget_used_usd,
                         limit=overview.budget_limit_usd, used_text=f"${overview.budget_used_usd:,.6f}",
                         limit_text=f"${overview.budget_limit_usd:,.2f}",
                         thresholds=alert_percents(LimitScope.tenant(tenant.pk))))
    return bars
