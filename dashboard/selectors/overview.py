"""A tenant's current period at a glance: spend, tokens by kind, requests, cache hit rate, quota and budget."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal

from django.utils import timezone

from billing.selectors import (Period, admission_used, days_between, femtos_to_usd, limits_explain, month_containing,
                               today_in, usage_by_day, usage_totals)
from tenants.models import Tenant
from tenants.services.limits import LimitSource

NANOS_PER_USD = 10**9


@dataclass(frozen=True, slots=True)
class Overview:
    period: Period
    totals: dict[str, int]  # billing's FIGURES over the period so far
    quota_used: int  # tokens, as admission counts them (billing.ledger.ledger_totals)
    budget_used_nanos: int  # nano-USD, as admission counts them
    limits: list[LimitSource]
    by_day: dict[date, dict[str, int]] = field(default_factory=dict)  # the period's days so far (the chart)

    @property
    def spend_usd(self) -> Decimal:
        return femtos_to_usd(self.totals["cost_femtos"])

    @property
    def prompt_tokens(self) -> int:
        return self.totals["input_tokens"] + self.totals["cached_input_tokens"]

    @property
    def cache_hit_rate(self) -> float | None:
        """Share of prompt tokens served from the prefix cache."""
        return self.totals["cached_input_tokens"] / self.prompt_tokens if self.prompt_tokens else None

    def limit(self, name: str) -> int:
        return next(row.effective for row in self.limits if row.name == name)

    @property
    def quota_limit(self) -> int:
        return self.limit("monthly_token_quota")

    @property
    def budget_limit_usd(self) -> Decimal:
        return Decimal(self.limit("monthly_spend_limit_micros")).scaleb(-6)

    @property
    def budget_used_usd(self) -> Decimal:
        return Decimal(self.budget_used_nanos).scaleb(-9)


def overview_get(*, tenant: Tenant, now: datetime | None = None) -> Overview:
    now = now or timezone.now()
    period = month_containing(instant=now, tz=tenant.timezone)
    days = days_between(first=period.month, last=today_in(tenant.timezone, now), tz=tenant.timezone)
    by_day = usage_by_day(tenant=tenant, days=days)
    totals = usage_totals(by_day)
    quota_used, budget_used_nanos = admission_used(tenant=tenant, period=period)  # what admission counts
    return Overview(period=period, totals=totals, quota_used=quota_used, budget_used_nanos=budget_used_nanos,
                    limits=limits_explain(tenant=tenant), by_day=by_day)
