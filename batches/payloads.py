"""The API's objects: a file and a batch, as OpenAI's Files and Batch APIs show them."""

from __future__ import annotations

from datetime import datetime

from batches.models import Batch, StoredFile


def unix(value: datetime | None) -> int | None:
    return int(value.timestamp()) if value is not None else None


def file_payload(file: StoredFile) -> dict:
    return {
        "id": file.public_id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": unix(file.created_at),
        "expires_at": unix(file.expires_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": file.status,
        "status_details": None,
    }


def file_deleted_payload(file: StoredFile) -> dict:
    return {"id": file.public_id, "object": "file", "deleted": True}


def _file_id(file: StoredFile | None) -> str | None:
    return file.public_id if file is not None else None


def batch_payload(batch: Batch) -> dict:
    return {
        "id": batch.public_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": batch.model or None,
        "errors": batch.errors,
        "input_file_id": batch.input_file.public_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": _file_id(batch.output_file),
        "error_file_id": _file_id(batch.error_file),
        "created_at": unix(batch.created_at),
        "in_progress_at": unix(batch.in_progress_at),
        "expires_at": unix(batch.expires_at),
        "finalizing_at": unix(batch.finalizing_at),
        "completed_at": unix(batch.completed_at),
        "failed_at": unix(batch.failed_at),
        "expired_at": unix(batch.expired_at),
        "cancelling_at": unix(batch.cancelling_at),
        "cancelled_at": unix(batch.cancelled_at),
        "request_counts": {"total": batch.total, "completed": batch.completed, "failed": batch.failed},
        "metadata": batch.metadata,
    }


def list_payload(items: list[dict], *, has_more: bool) -> dict:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}
