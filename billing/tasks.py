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


@shared_task(name="billing.tasks.release_stale_reservations", ignore_result=True)
def release_stale_reservations() -> int:
    """Settle or release admission reservations older than the longest request (a lost settlement)."""
    from billing.services.admission_settle import reservations_release_stale

    return reservations_release_stale()


@shared_task(name="billing.tasks.send_budget_alert", ignore_result=True, autoretry_for=(OSError,), retry_backoff=True,
             max_retries=5)
def send_budget_alert(*, scope: str, period: str, percent: int, used: int, limit: int) -> int:
    """E-mail the owners that `percent` of a monthly budget is used (marked once per threshold and period)."""
    from billing.services.budget_alerts import budget_alert_send

    return budget_alert_send(scope=scope, period=period, percent=percent, used_nanos=used, limit_nanos=limit)
