"""A tenant's files: what `/v1/files` lists. The bytes live in the `files` storage (settings.FILE_STORAGE).

Tenants name a file by its random `public_id` (`file-...`, as OpenAI's), never by the row's id. A deleted
file keeps its row (`deleted_at`: a batch still names its input file) and loses its bytes.
"""

import secrets
import string

from django.db import models
from django.utils.timezone import now

from tenants.models import Tenant

PUBLIC_ID_PREFIX = "file-"
_ALPHABET = string.ascii_letters + string.digits


def file_public_id_new() -> str:
    """`file-` + 24 letters and digits (142 bits)."""
    return PUBLIC_ID_PREFIX + "".join(secrets.choice(_ALPHABET) for _ in range(24))


class StoredFile(models.Model):
    class Purpose(models.TextChoices):
        BATCH = "batch", "Batch input"
        BATCH_OUTPUT = "batch_output", "Batch output or errors"

    class Status(models.TextChoices):  # OpenAI's (deprecated there, still sent): a stored file is "processed"
        UPLOADED = "uploaded", "Uploaded"
        PROCESSED = "processed", "Processed"
        ERROR = "error", "Error"

    public_id = models.CharField(max_length=40, unique=True, default=file_public_id_new, editable=False,
                                 help_text="The file's id in URLs and the API")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="files")
    purpose = models.CharField(max_length=20, choices=Purpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.BigIntegerField()
    storage_name = models.CharField(max_length=300, help_text="The file's name in the `files` storage")
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PROCESSED)
    created_at = models.DateTimeField(default=now)
    expires_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True, help_text="Deleted by the tenant: bytes gone")

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at", "id"], name="file_tenant_created")]

    def __str__(self) -> str:
        return f"{self.public_id} ({self.filename})"
