"""The size of an upload's body at the ASGI edge (platform_site/asgi.py, common.request_body.body_limit).

Bodies under /v1 are refused over DATA_UPLOAD_MAX_MEMORY_SIZE before they are read; `POST /v1/files` alone may
carry a file of up to settings.FILES_MAX_BYTES, plus its multipart form's own bytes. Django then spools the
file to a temporary file past FILE_UPLOAD_MAX_MEMORY_SIZE (never the whole body in memory), and the upload
service checks the file's own size (batches.services.files.upload_check).
"""

from __future__ import annotations

from django.conf import settings

UPLOAD_PATH = "/v1/files"
FORM_OVERHEAD_BYTES = 64 * 1024  # the boundaries, the parts' headers, the `purpose` field


def upload_body_max_bytes() -> int:
    return int(settings.FILES_MAX_BYTES) + FORM_OVERHEAD_BYTES


def is_upload_path(path: str) -> bool:
    return path == UPLOAD_PATH


def is_other_api_path(path: str) -> bool:
    """Under /v1, not the upload: the default limit."""
    return (path == "/v1" or path.startswith("/v1/")) and path != UPLOAD_PATH
