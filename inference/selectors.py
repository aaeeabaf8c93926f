"""Reads of the served-model registry, as a tier sees it."""

from __future__ import annotations

from inference.models import ServedModel
from tenants.models import Tier

MAX_NAME_LENGTH = 100


def model_name_plausible(name) -> bool:
    """Whether `name` may name a model row, checked before a query: NUL and other control characters never
    name one (PostgreSQL rejects NUL in text), nor does a name longer than the column."""
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME_LENGTH and name.isprintable()


def served_model_list_for_tier(*, tier: Tier) -> list[ServedModel]:
    """Enabled models the tier may call, by name."""
    enabled = ServedModel.objects.filter(enabled=True).order_by("name")
    return [model for model in enabled if tier.allows_model(model.name)]


def served_model_get_for_tier(*, tier: Tier, name: str) -> ServedModel | None:
    """The enabled model `name` if the tier may call it, else None (callers answer 404)."""
    if not model_name_plausible(name) or not tier.allows_model(name):
        return None
    return ServedModel.objects.filter(enabled=True, name=name).first()


async def aserved_model_get_for_tier(*, tier: Tier, name: str) -> ServedModel | None:
    if not model_name_plausible(name) or not tier.allows_model(name):
        return None
    return await ServedModel.objects.filter(enabled=True, name=name).afirst()


def database_check() -> dict[str, str]:
    """Part of /readyz (inference.serving.readiness): "ok" or why not, for the database."""
    from django.db import DatabaseError, connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"database": "ok"}
    except DatabaseError as exc:
        return {"database": f"unavailable: {exc}".strip()[:200]}


def worker_ready(*, model: str | None, host: str, worker_id: str | None = None) -> bool:
    """A worker on `host` (of `model`, or with `worker_id`) has its model loaded and takes work."""
    from inference.queue import get_job_queue

    for info in get_job_queue().live_workers(model):
        if worker_id is not None and info.get("worker_id") != worker_id:
            continue
        if info.get("host") == host and info.get("status") == "serving":
            return True
    return False
