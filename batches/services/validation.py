"""A batch's `validating` phase: its input file's lines checked (batches.services.lines), then stored as
`BatchLine` rows and the batch `in_progress`, or the batch `failed` with OpenAI's `errors`.

As OpenAI's Batch API: one refused line fails the whole batch, and `errors.data` lists the refused lines
(`code`, `message`, `param`, `line`), at most MAX_REPORTED_ERRORS of them; a file with no request
(`empty_file`) or with more than BATCH_MAX_LINES (`too_many_requests`) fails too, and so does one whose prompt
tokens do not fit the tenant's batch queue for its model (`token_limit_exceeded`). Idempotent: a batch no
longer `validating` (validated already, or cancelled meanwhile) is left as it is.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction

from batches.models import Batch, BatchLine
from batches.services.files import file_open
from batches.services.lines import FileCheck, LineError, LineRefused, line_check
from batches.services.queue_limit import batch_queue_limit, queue_refusal
from batches.services.transitions import S, batch_transition

logger = logging.getLogger(__name__)
MAX_REPORTED_ERRORS = 100
CREATE_CHUNK = 1000


class _Superseded(Exception):
    """The batch left `validating` while its lines were being stored (cancelled): they are rolled back."""


def _file_error(code: str, message: str, param: str | None = None) -> list[LineError]:
    return [LineError(code=code, message=message, param=param, line=None)]


@dataclass(slots=True)
class CheckedFile:
    lines: list[tuple[int, str, str]]  # (line number, custom_id, body JSON text)
    errors: list[LineError]
    model: str | None = None
    input_tokens: int = 0  # the lines' prompt tokens


def input_lines_check(*, batch: Batch) -> CheckedFile:
    """The input file's requests as (line number, custom_id, body), the refused lines, the model and the
    prompt tokens."""
    check = FileCheck(endpoint=batch.endpoint, tier=batch.tenant.tier, custom_ids=set())
    lines, errors, requests = [], [], 0
    try:
        source = file_open(file=batch.input_file)
    except Exception:  # noqa: BLE001 - gone (deleted meanwhile), or the storage refused (S3's own errors)
        logger.warning("batch %s: its input file %s could not be opened", batch.public_id, batch.input_file.public_id,
                       exc_info=True)
        return CheckedFile([], _file_error("file_unreadable", "The input file could not be read (was it "
                                           "deleted?).", "input_file_id"))
    with source:
        for number, raw in enumerate(source, start=1):
            if not raw.strip():
                continue  # blank lines (the last newline's) are no request
            requests += 1
            if requests > settings.BATCH_MAX_LINES:
                return CheckedFile([], _file_error("too_many_requests", f"The input file holds more than "
                                                   f"{settings.BATCH_MAX_LINES} requests.", "input_file_id"))
            try:
                custom_id, body = line_check(raw=raw, check=check)
            except LineRefused as refused:
                errors.append(LineError(code=refused.code, message=refused.message, param=refused.param,
                                        line=number))
                continue
            lines.append((number, custom_id, body))
    if not requests:
        return CheckedFile([], _file_error("empty_file", "The input file holds no request.", "input_file_id"))
    return CheckedFile(lines, errors, check.model, check.input_tokens)


def batch_validate(*, batch_id: int) -> Batch | None:
    """Check a `validating` batch's lines; store them and start it, or fail it with the refused lines."""
    batch = Batch.objects.select_related("input_file", "tenant__tier").filter(pk=batch_id).first()
    if batch is None or batch.status != S.VALIDATING:
        return batch
    checked = input_lines_check(batch=batch)
    if checked.errors:
        reported = [error.to_dict() for error in checked.errors[:MAX_REPORTED_ERRORS]]
        batch_transition(batch=batch, to=S.FAILED, errors={"object": "list", "data": reported})
        return batch
    try:
        _lines_store(batch=batch, checked=checked)
    except (_Superseded, IntegrityError):  # another validation of it (a redelivered task) stored them first
        batch.refresh_from_db()
    return batch


def _lines_store(*, batch: Batch, checked: CheckedFile) -> None:
    """The lines stored and the batch in_progress, or failed with `token_limit_exceeded` when it does not fit
    the tenant's batch queue (the tenant's row locked until this commits: batches.services.queue_limit)."""
    limit = batch_queue_limit(tier=batch.tenant.tier, model=checked.model)
    with transaction.atomic():
        refusal = queue_refusal(batch=batch, model=checked.model, input_tokens=checked.input_tokens, limit=limit)
        # the batch's row locked next: a cancel's UPDATE of it waits for this to commit, then finds the
        # batch in_progress with its lines to cancel
        if not Batch.objects.select_for_update().filter(pk=batch.pk, status=S.VALIDATING).exists():
            raise _Superseded
        if refusal is not None:
            batch_transition(batch=batch, to=S.FAILED, errors={"object": "list", "data": [refusal]},
                             model=checked.model, input_tokens=checked.input_tokens)
            return
        BatchLine.objects.bulk_create(
            [BatchLine(batch=batch, line_no=number, custom_id=custom_id, body=body)
             for number, custom_id, body in checked.lines], batch_size=CREATE_CHUNK)
        if not batch_transition(batch=batch, to=S.IN_PROGRESS, total=len(checked.lines), model=checked.model,
                                input_tokens=checked.input_tokens):
            raise _Superseded  # SQLite takes no row lock: a cancel came in between


def batches_validate_stale(*, older_than_s: float = 60.0, limit: int = 100) -> int:
    """Validate up to `limit` batches `validating` for more than `older_than_s` (their task lost); how many."""
    from datetime import timedelta

    from django.utils import timezone

    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    stale = list(Batch.objects.filter(status=S.VALIDATING, created_at__lt=cutoff).order_by("pk")
                 .values_list("pk", flat=True)[:limit])
    for batch_id in stale:
        batch_validate(batch_id=batch_id)
    return len(stale)
