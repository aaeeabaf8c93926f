"""Reads of a tenant's files and batches: only ever the tenant's own (another tenant's id is unknown here)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet, Sum

from batches.models import Batch, StoredFile
from common.errors import InvalidRequest

# the states a batch holds its place in the batch queue in (its lines may still run): batches.services.queue_limit
QUEUED = (Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING, Batch.Status.CANCELLING)


@dataclass(frozen=True, slots=True)
class Page:
    items: list
    has_more: bool


def file_get(*, tenant, file_id: str) -> StoredFile | None:
    """The tenant's file `file_id` (not deleted), or None."""
    return StoredFile.objects.filter(tenant=tenant, public_id=file_id, deleted_at__isnull=True).first()


def files_of(*, tenant, purpose: str | None = None) -> QuerySet[StoredFile]:
    files = StoredFile.objects.filter(tenant=tenant, deleted_at__isnull=True)
    return files.filter(purpose=purpose) if purpose else files


def batch_get(*, tenant, batch_id: str) -> Batch | None:
    return _batches(tenant).filter(public_id=batch_id).first()


def batches_of(*, tenant) -> QuerySet[Batch]:
    return _batches(tenant)


def queued_tokens(*, tenant_id: int, model: str, exclude_pk: int | None = None) -> int:
    """Prompt tokens the tenant's unfinished batches for `model` hold in its batch queue."""
    rows = Batch.objects.filter(tenant_id=tenant_id, model=model, status__in=QUEUED)
    if exclude_pk is not None:
        rows = rows.exclude(pk=exclude_pk)
    return int(rows.aggregate(total=Sum("input_tokens"))["total"] or 0)


@dataclass(frozen=True, slots=True)
class BatchQueue:
    model: str
    held: int  # prompt tokens of the tenant's unfinished batches for the model
    limit: int  # 0: none


def batch_queues(*, tenant) -> tuple[int, list[BatchQueue]]:
    """(the tier's limit for every model without its own, one row per model the tenant has batches queued for or
    the tier limits on its own), as batches.services.queue_limit enforces them."""
    from tenants.models import TierModelLimit

    tier = tenant.tier
    own = dict(TierModelLimit.objects.filter(tier=tier, batch_queue_tokens__isnull=False)
               .values_list("model_name", "batch_queue_tokens"))
    held = dict(Batch.objects.filter(tenant=tenant, status__in=QUEUED).order_by().values("model")
                .annotate(total=Sum("input_tokens")).values_list("model", "total"))
    default = int(tier.batch_queue_tokens or 0)
    return default, [BatchQueue(model=model, held=int(held.get(model) or 0), limit=int(own.get(model, default)))
                     for model in sorted(set(own) | set(held))]


def _batches(tenant) -> QuerySet[Batch]:
    return Batch.objects.filter(tenant=tenant).select_related("input_file", "output_file", "error_file")


def page_after(rows: QuerySet, *, tenant, after: str | None, limit: int, newest_first: bool = True) -> Page:
    """Cursor pagination, OpenAI's: `after` is the id of the last item of the previous page, looked up among
    the tenant's rows of the model, deleted ones included (a file deleted between two pages still marks the
    place); another tenant's id is no cursor (400, as any unknown id)."""
    sign = "-" if newest_first else ""
    rows = rows.order_by(f"{sign}created_at", f"{sign}pk")
    if after:
        cursor = rows.model.objects.filter(tenant=tenant, public_id=after).values("created_at", "pk").first()
        if cursor is None:
            raise InvalidRequest(f"Invalid 'after': no object with id {after[:64]!r}.", param="after",
                                 code="invalid_value")
        at, pk = cursor["created_at"], cursor["pk"]
        if newest_first:
            rows = rows.filter(Q(created_at__lt=at) | Q(created_at=at, pk__lt=pk))
        else:
            rows = rows.filter(Q(created_at__gt=at) | Q(created_at=at, pk__gt=pk))
    items = list(rows[: limit + 1])
    return Page(items=items[:limit], has_more=len(items) > limit)
