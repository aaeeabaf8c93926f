"""Adjustments: a credit or debit with a reason and the operator who made it; never an edit."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.core.exceptions import ValidationError
from django.utils import timezone

from billing.models import Adjustment
from billing.money import FEMTOS_PER_USD
from tenants.models import Tenant


def usd_to_femtos(amount: Decimal | str) -> int:
    try:
        femtos = Decimal(str(amount)) * FEMTOS_PER_USD
    except InvalidOperation as exc:
        raise ValidationError({"amount": f"an amount in USD, not {amount!r}"}) from exc
    if not femtos.is_finite() or femtos != femtos.to_integral_value() or femtos <= 0:
        raise ValidationError({"amount": "a positive amount in USD with at most 15 decimal places"})
    return int(femtos)


def adjustment_create(*, tenant: Tenant, kind: str, amount_usd: Decimal | str, reason: str, operator,
                      effective_at: datetime | None = None) -> Adjustment:
    if kind not in Adjustment.Kind.values:
        raise ValidationError({"kind": f"one of {Adjustment.Kind.values}"})
    if not (reason or "").strip():
        raise ValidationError({"reason": "say why"})
    if operator is None:
        raise ValidationError({"operator": "an adjustment names the operator who made it"})
    return Adjustment.objects.create(
        tenant=tenant, kind=kind, amount_femtos=usd_to_femtos(amount_usd), reason=reason.strip(),
        operator=operator, effective_at=effective_at or timezone.now(),
    )
