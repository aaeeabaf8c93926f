"""A tenant's Batch API batches for the dashboard: batches' own reads (batches.selectors, only ever the
tenant's rows), one page at a time, each batch with its progress, when it finished and its files."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.core.paginator import Page, Paginator

from batches.models import Batch, StoredFile
from batches.selectors import batch_queues, batches_of, file_get
from tenants.models import Tenant

__all__ = ["PAGE_SIZE", "BatchRow", "batch_queues", "batches_page", "file_get"]

PAGE_SIZE = 50
_FILES = (("input", "input_file"), ("output", "output_file"), ("errors", "error_file"))


@dataclass(frozen=True, slots=True)
class BatchRow:
    batch: Batch
    done: int  # lines finished either way: completed + failed
    percent: int  # of `total`, rounded down (100 only once all are done); 0 before validation counts them
    finished_at: datetime | None  # when it reached an end state (completed, failed, expired, cancelled)
    files: tuple[tuple[str, StoredFile], ...]  # (role, file) for each file the batch has, deleted ones included


def _row(batch: Batch) -> BatchRow:
    done = batch.completed + batch.failed
    finished = batch.completed_at or batch.failed_at or batch.expired_at or batch.cancelled_at
    files = tuple((role, getattr(batch, field)) for role, field in _FILES if getattr(batch, field) is not None)
    return BatchRow(batch=batch, done=done, percent=done * 100 // batch.total if batch.total else 0,
                    finished_at=finished, files=files)


def batches_page(*, tenant: Tenant, number: str | None) -> tuple[Page, list[BatchRow]]:
    """Page `number` of the tenant's batches, newest first (Paginator.get_page: a page number that is not one
    gives the first page, one past the end the last), and its rows."""
    page = Paginator(batches_of(tenant=tenant).order_by("-created_at", "-pk"), PAGE_SIZE).get_page(number)
    return page, [_row(batch) for batch in page.object_list]
