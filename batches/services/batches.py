"""Creating and cancelling batches. A new batch is `validating` until its task (batches.tasks.validate_batch)
has checked its input file's lines (batches.services.validation)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from batches.models import Batch, BatchLine, StoredFile
from batches.models.batches import COMPLETION_WINDOWS, ENDPOINTS
from batches.services.transitions import S, batch_transition
from batches.text import storable
from common.errors import ApiError, InvalidRequest, NotFound

logger = logging.getLogger(__name__)
WINDOW = {"24h": timedelta(hours=24)}
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512


def metadata_check(metadata) -> dict | None:
    """OpenAI's metadata: at most 16 pairs, keys of at most 64 characters, string values of at most 512."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidRequest("Invalid 'metadata': expected an object of strings.", param="metadata",
                             code="invalid_type")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidRequest(f"Invalid 'metadata': at most {MAX_METADATA_PAIRS} pairs.", param="metadata",
                             code="invalid_value")
    for key, value in metadata.items():
        if not storable(key) or (isinstance(value, str) and not storable(value)):
            raise InvalidRequest("Invalid 'metadata': keys and values cannot hold NUL or lone surrogates.",
                                 param="metadata", code="invalid_value")
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise InvalidRequest(f"Invalid 'metadata': a key is longer than {MAX_METADATA_KEY_CHARS} characters.",
                                 param="metadata", code="invalid_value")
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS:
            raise InvalidRequest(f"Invalid 'metadata.{key[:64]}': expected a string of at most "
                                 f"{MAX_METADATA_VALUE_CHARS} characters.", param="metadata", code="invalid_value")
    return metadata


def _input_file(*, tenant, input_file_id: str) -> StoredFile:
    file = StoredFile.objects.filter(tenant=tenant, public_id=input_file_id, deleted_at__isnull=True).first()
    if file is None:
        raise NotFound(f"No file with id {input_file_id[:64]!r}.", param="input_file_id", code="file_not_found")
    if file.purpose != StoredFile.Purpose.BATCH:
        raise InvalidRequest(f"The file {input_file_id} was not uploaded for purpose 'batch'.",
                             param="input_file_id", code="invalid_value")
    return file


def batch_create(*, tenant, api_key, input_file_id: str, endpoint: str, completion_window: str,
                 metadata: dict | None = None) -> Batch:
    """A batch of the tenant's input file's requests, `validating` until its validation task has run."""
    if endpoint not in ENDPOINTS:
        raise InvalidRequest(f"Invalid 'endpoint': expected one of {', '.join(ENDPOINTS)}.", param="endpoint",
                             code="invalid_value")
    if completion_window not in COMPLETION_WINDOWS:
        raise InvalidRequest("Invalid 'completion_window': only '24h' is supported.", param="completion_window",
                             code="invalid_value")
    metadata = metadata_check(metadata)
    file = _input_file(tenant=tenant, input_file_id=input_file_id)
    created = timezone.now()
    with transaction.atomic():
        batch = Batch.objects.create(
            tenant=tenant, api_key=api_key, endpoint=endpoint, completion_window=completion_window,
            input_file=file, metadata=metadata, created_at=created, expires_at=created + WINDOW[completion_window])
        transaction.on_commit(lambda: _validation_enqueue(batch.pk))
    return batch


def _validation_enqueue(batch_id: int) -> None:
    # by the task's name: batches.tasks (thin) imports the services, never the other way round
    from celery import signature

    try:
        signature("batches.tasks.validate_batch", kwargs={"batch_id": batch_id}).delay()
    except Exception:  # noqa: BLE001 - the batch stays `validating`; batches.tasks.validate_pending retries it
        logger.exception("could not queue the validation of batch %s", batch_id)


def batch_cancel(*, batch: Batch) -> Batch:
    """Cancel: `cancelling` at once, `cancelled` once no line is running. Cancelling a batch that is already
    cancelling or cancelled answers it as it is; a finished one (completed, failed, expired) is a 409."""
    if not batch_transition(batch=batch, to=S.CANCELLING):
        batch.refresh_from_db()
        if batch.status in (S.CANCELLING, S.CANCELLED):
            return batch
        raise ApiError(f"Cannot cancel a batch with status '{batch.status}'.", status=409,
                       code="batch_not_cancellable")
    batch_cancel_settle(batch=batch)  # none running: cancelled now, with the files of the lines that ran
    batch.refresh_from_db()
    return batch


def batch_cancel_settle(*, batch: Batch) -> bool:
    """A cancelling batch's pending lines become `cancelled`; once none is running, the batch is `cancelled`
    (True when this call moved it). The runner calls this again as each running line of a cancelling batch
    ends."""
    from batches.services.outputs import batch_files_write, files_discard

    with transaction.atomic():
        BatchLine.objects.filter(batch=batch, status=BatchLine.Status.PENDING).update(
            status=BatchLine.Status.CANCELLED, finished_at=timezone.now())
        if BatchLine.objects.filter(batch=batch, status=BatchLine.Status.RUNNING).exists():
            return False
        # its files with the move: a client that sees `cancelled` finds them (never a cancelled batch without)
        output, errors = batch_files_write(batch=batch)
        if batch_transition(batch=batch, to=S.CANCELLED, output_file=output, error_file=errors):
            return True
    files_discard(output, errors)
    return False
