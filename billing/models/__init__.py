"""Billing's models, one module per concern."""

from billing.models.usage import UsageRecord

__all__ = ["UsageRecord"]
