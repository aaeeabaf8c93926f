"""Celery tasks of the billing app (thin: each calls one service; all idempotent)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="billing.tasks.rollup_hourly_usage", ignore_result=True)
def rollup_hourly_usage() -> dict:
    """Fill the hourly usage rollup up to the last complete hour (late records folded in)."""
    from billing.services.rollups import hourly_usage_fill

    result = hourly_usage_fill()
    return {"end": result.end.isoformat(), "late_hours": result.late_hours, "rows": result.rows}
