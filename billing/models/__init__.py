"""Billing's models, one module per concern."""

from billing.models.adjustments import Adjustment
from billing.models.budgets import TenantBudget
from billing.models.invoices import Invoice, InvoiceLine
from billing.models.prices import Price
from billing.models.rollups import DailyLatency, DailyUsage, FillState, HourlyUsage
from billing.models.usage import UsageRecord

__all__ = ["Adjustment", "DailyLatency", "DailyUsage", "FillState", "HourlyUsage", "Invoice", "InvoiceLine", "Price", "TenantBudget",
           "UsageRecord"]
