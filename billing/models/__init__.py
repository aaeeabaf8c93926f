"""Billing's models, one module per concern."""

from billing.models.adjustments import Adjustment
from billing.models.invoices import Invoice, InvoiceLine
from billing.models.prices import Price
from billing.models.rollups import DailyUsage, FillState, HourlyUsage
from billing.models.usage import UsageRecord

__all__ = ["Adjustment", "DailyUsage", "FillState", "HourlyUsage", "Invoice", "InvoiceLine", "Price", "UsageRecord"]
