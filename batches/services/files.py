"""Files: stored through Django's storage API (settings.FILE_STORAGE, the `files` storage), one folder per
tenant; the row says whose a file is, what for, and where its bytes are.

Upload accepts a JSONL file for `purpose: "batch"` (its name ends in `.jsonl`, it is no larger than
FILES_MAX_BYTES); its lines are checked when a batch is made from it (batches.services.validation), as
OpenAI's Batch API does.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.files.storage import storages
from django.db import transaction
from django.utils import timezone

from batches.models import StoredFile
from common.errors import ApiError, InvalidRequest

logger = logging.getLogger(__name__)
UPLOAD_PURPOSES = (StoredFile.Purpose.BATCH,)
MAX_FILENAME_CHARS = 255


def files_storage():
    return storages["files"]


def _name_check(filename: str) -> str:
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    if not name or len(name) > MAX_FILENAME_CHARS or not name.isprintable():
        raise InvalidRequest(f"The file's name must be 1 to {MAX_FILENAME_CHARS} printable characters.",
                             param="file", code="invalid_file_name")
    if not name.lower().endswith(".jsonl"):
        raise InvalidRequest("Invalid file format for Batch API. Must be .jsonl", param="file",
                             code="invalid_file_format")
    return name


def upload_check(*, purpose, upload) -> str:
    """The upload's file name once `purpose` and the file pass; ApiError otherwise."""
    if purpose not in UPLOAD_PURPOSES:
        raise InvalidRequest(f"Invalid 'purpose': {str(purpose)[:40]!r}; expected one of "
                             f"{', '.join(map(str, UPLOAD_PURPOSES))}.", param="purpose", code="invalid_value")
    if upload is None:
        raise InvalidRequest("Missing required parameter: 'file' (multipart/form-data).", param="file",
                             code="missing_required_parameter")
    name = _name_check(upload.name)
    if upload.size > settings.FILES_MAX_BYTES:
        raise ApiError(f"The file is too large: {upload.size} bytes; the limit is {settings.FILES_MAX_BYTES}.",
                       param="file", code="file_too_large", status=413)
    return name


def file_create(*, tenant, purpose: str, upload) -> StoredFile:
    """Store `upload` (a Django UploadedFile) as one of `tenant`'s files."""
    filename = upload_check(purpose=purpose, upload=upload)
    file = StoredFile(tenant=tenant, purpose=purpose, filename=filename, bytes=upload.size)
    upload.seek(0)
    file.storage_name = files_storage().save(f"tenant-{tenant.pk}/{file.public_id}.jsonl", upload)
    try:
        file.save()
    except BaseException:
        files_storage().delete(file.storage_name)  # no bytes without their row
        raise
    return file


def file_content_create(*, tenant, purpose: str, filename: str, content: bytes) -> StoredFile:
    """A file the platform writes for a tenant (a batch's output or errors)."""
    from django.core.files.base import ContentFile

    file = StoredFile(tenant=tenant, purpose=purpose, filename=filename, bytes=len(content))
    file.storage_name = files_storage().save(f"tenant-{tenant.pk}/{file.public_id}.jsonl", ContentFile(content))
    file.save()
    return file


def file_open(*, file: StoredFile):
    """The file's bytes, open for reading (the caller closes it)."""
    return files_storage().open(file.storage_name, "rb")


def _bytes_delete(name: str) -> None:
    try:
        files_storage().delete(name)
    except OSError:  # the row says deleted; bytes left behind are the operator's to sweep, never a 500
        logger.exception("could not delete the stored file %s", name)


def file_delete(*, file: StoredFile) -> bool:
    """Mark the file deleted (its row stays: batches name it) and remove its bytes once that is committed.
    False when another request deleted it first."""
    with transaction.atomic():
        marked = StoredFile.objects.filter(pk=file.pk, deleted_at__isnull=True).update(deleted_at=timezone.now())
        if marked:
            transaction.on_commit(lambda: _bytes_delete(file.storage_name))
    return bool(marked)
