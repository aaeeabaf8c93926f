"""Display filters for figures: USD to a number of places (display only: the data islands keep exact values)."""

from decimal import ROUND_HALF_EVEN, Decimal

from django import template

register = template.Library()


@register.filter
def usd(value, places=2) -> str:
    amount = Decimal(str(value)).quantize(Decimal(1).scaleb(-int(places)), rounding=ROUND_HALF_EVEN)
    return f"{amount:,}"


@register.filter
def percent(value) -> str:
    return f"{float(value) * 100:.1f}%"


@register.filter
def share(used, limit) -> str:
    limit = Decimal(str(limit))
    return f"{Decimal(str(used)) * 100 / limit:.1f}%" if limit else "–"
