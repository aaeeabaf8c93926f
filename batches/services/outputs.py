"""A batch's output and error files, in OpenAI's line format, written once its lines are done.

Output file: one line per completed request, in input order:
    {"id": "batch_req_...", "custom_id", "response": {"status_code": 200, "request_id", "body"}, "error": null}
Error file: the requests that failed (their 4xx/5xx response, as the live endpoint would have answered) or never
ran (`response: null`, `error: {code, message}`: `batch_expired`, `batch_cancelled`, or the runner's own).
Either file is absent (null id) when it would be empty. Written to a spooled temporary file, never whole in memory.
"""

from __future__ import annotations

import hashlib
import json
import tempfile

from django.core.files import File
from django.db import transaction

from batches.models import Batch, BatchLine, StoredFile
from batches.services.files import file_delete, files_storage
from batches.services.transitions import S, batch_transition

L = BatchLine.Status
SPOOL_BYTES = 8 * 1024 * 1024
NOT_RUN = {
    L.EXPIRED: {"code": "batch_expired", "message": "This request could not be executed before the completion "
                "window expired."},
    L.CANCELLED: {"code": "batch_cancelled", "message": "This request was not executed: the batch was cancelled."},
}


def output_line_id(line: BatchLine) -> str:
    """A stable id per (batch, line): the same file written twice names its lines alike."""
    digest = hashlib.sha256(f"{line.batch_id}:{line.custom_id}".encode()).hexdigest()[:24]
    return f"batch_req_{digest}"


def output_line(line: BatchLine) -> dict:
    """The line as the output or error file holds it."""
    response = None
    if line.response_status is not None:
        body = json.loads(line.response_body) if line.response_body else None
        response = {"status_code": line.response_status, "request_id": line.request_id, "body": body}
    error = line.error if response is None else None
    if response is None and error is None:
        error = NOT_RUN.get(line.status, {"code": "batch_line_failed", "message": "This request failed."})
    return {"id": output_line_id(line), "custom_id": line.custom_id, "response": response, "error": error}


def _save(batch: Batch, kind: str, spool) -> StoredFile | None:
    size = spool.tell()
    if not size:
        return None
    spool.seek(0)
    file = StoredFile(tenant_id=batch.tenant_id, purpose=StoredFile.Purpose.BATCH_OUTPUT,
                      filename=f"{batch.public_id}_{kind}.jsonl", bytes=size)
    file.storage_name = files_storage().save(f"tenant-{batch.tenant_id}/{file.public_id}.jsonl", File(spool))
    file.save()
    return file


def batch_files_write(*, batch: Batch) -> tuple[StoredFile | None, StoredFile | None]:
    """Write the batch's output and error files from its lines (those done; pending and running ones are left
    out); returns (output, errors), each None when empty."""
    with tempfile.SpooledTemporaryFile(SPOOL_BYTES) as output, tempfile.SpooledTemporaryFile(SPOOL_BYTES) as errors:
        lines = BatchLine.objects.filter(batch=batch).exclude(status__in=(L.PENDING, L.RUNNING)).order_by("line_no")
        for line in lines.iterator(chunk_size=2000):
            target = output if line.status == L.COMPLETED else errors
            target.write(json.dumps(output_line(line), separators=(",", ":")).encode() + b"\n")
        return _save(batch, "output", output), _save(batch, "errors", errors)


def batch_files_attach(*, batch: Batch) -> bool:
    """Write a finished batch's files and attach them once: a finalizing batch then `completed`; an expired or
    cancelled one keeps its state. False (the files written here deleted) when another call attached first."""
    output, errors = batch_files_write(batch=batch)
    with transaction.atomic():
        if batch.status == S.FINALIZING:
            attached = batch_transition(batch=batch, to=S.COMPLETED, output_file=output, error_file=errors)
        else:
            attached = bool(Batch.objects.filter(
                pk=batch.pk, status__in=(S.EXPIRED, S.CANCELLED), output_file__isnull=True,
                error_file__isnull=True).update(output_file=output, error_file=errors))
    if not attached:
        files_discard(output, errors)
    return attached


def files_discard(*files: StoredFile | None) -> None:
    """Delete files written for a batch that another call moved first."""
    for file in files:
        if file is not None:
            file_delete(file=file)
