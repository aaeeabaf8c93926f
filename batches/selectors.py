"""Reads of a tenant's files and batches: only ever the tenant's own (another tenant's id is unknown here)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from batches.models import Batch, StoredFile
from common.errors import InvalidRequest


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
