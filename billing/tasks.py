"""Celery tasks of the billing app (thin: each calls one service; all idempotent)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="billing.tasks.rollup_hourly_usage", ignore_result=True)
def rollup_hourly_usage() -> dict:
    """Fill the hourly usage rollup up to the last complete hour (late records folded in)."""
    from billing.services.rollups import hourly_usage_fill

    result = hourly_usage_fill()
    return {"end": result.end.isoformat(), "late_hours": result.late_hours, "rows": result.rows}


@shared_task(name="billing.tasks.close_invoices", ignore_result=True)
def close_invoices() -> dict:
    """Refresh this month's drafts; finalize last month's after the grace period; credit-note late changes."""
    from billing.services.invoices import invoices_close

    result = invoices_close()
    return {"drafts": len(result.drafts), "finalized": len(result.finalized), "credit_notes": len(result.credit_notes)}
