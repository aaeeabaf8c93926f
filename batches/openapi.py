"""OpenAPI pieces of the Files and Batch APIs (see tenants/openapi.py for how the components are used).

`components_add` is a spectacular postprocessing hook (settings.SPECTACULAR_SETTINGS, after
inference.api.openapi.document_complete): it puts COMPONENTS into the one document at /v1/openapi.json.
"""

from __future__ import annotations

from batches.models import Batch, StoredFile
from batches.models.batches import COMPLETION_WINDOWS, ENDPOINTS
from batches.services.batches import MAX_METADATA_KEY_CHARS, MAX_METADATA_PAIRS, MAX_METADATA_VALUE_CHARS
from tenants.openapi import ref

_UNIX_OR_NULL = {"type": ["integer", "null"]}
_STRING_OR_NULL = {"type": ["string", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
_METADATA = {"type": ["object", "null"], "maxProperties": MAX_METADATA_PAIRS,
             "propertyNames": {"maxLength": MAX_METADATA_KEY_CHARS},
             "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_CHARS}}
_BATCH_ERROR = {"type": "object", "required": ["code", "message", "param", "line"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "param": _STRING_OR_NULL,
                               "line": _UNIX_OR_NULL}}
_BATCH_TIMES = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
                "cancelled_at")


def _list(item: str) -> dict:
    return {"type": "object", "required": ["object", "data", "first_id", "last_id", "has_more"],
            "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": ref(item)},
                           "first_id": _STRING_OR_NULL, "last_id": _STRING_OR_NULL, "has_more": {"type": "boolean"}}}


_FILE_PROPERTIES = {
    "id": {"type": "string", "pattern": "^file-[A-Za-z0-9]+$"}, "object": {"const": "file"},
    "bytes": _COUNT, "created_at": {"type": "integer"}, "expires_at": _UNIX_OR_NULL,
    "filename": {"type": "string"}, "purpose": {"enum": list(StoredFile.Purpose.values)},
    "status": {"enum": list(StoredFile.Status.values)}, "status_details": _STRING_OR_NULL,
}
_BATCH_PROPERTIES = {
    "id": {"type": "string", "pattern": "^batch_[A-Za-z0-9]+$"}, "object": {"const": "batch"},
    "endpoint": {"enum": list(ENDPOINTS)}, "model": _STRING_OR_NULL,
    "errors": {"type": ["object", "null"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": _BATCH_ERROR}}},
    "input_file_id": {"type": "string"}, "completion_window": {"enum": list(COMPLETION_WINDOWS)},
    "status": {"enum": list(Batch.Status.values)}, "output_file_id": _STRING_OR_NULL,
    "error_file_id": _STRING_OR_NULL, "created_at": {"type": "integer"}, "expires_at": {"type": "integer"},
    **{name: _UNIX_OR_NULL for name in _BATCH_TIMES},
    "request_counts": {"type": "object", "required": ["total", "completed", "failed"],
                       "properties": {"total": _COUNT, "completed": _COUNT, "failed": _COUNT}},
    "metadata": _METADATA,
}

COMPONENTS = {
    "File": {"type": "object", "required": list(_FILE_PROPERTIES), "properties": _FILE_PROPERTIES},
    "FileList": _list("File"),
    "FileDeleted": {"type": "object", "required": ["id", "object", "deleted"],
                    "properties": {"id": {"type": "string"}, "object": {"const": "file"},
                                   "deleted": {"const": True}}},
    "FileUpload": {"type": "object", "required": ["file", "purpose"],
                   "properties": {"file": {"type": "string", "format": "binary",
                                           "description": "JSONL, one request a line; the name ends in .jsonl"},
                                  "purpose": {"enum": ["batch"]}}},
    "Batch": {"type": "object", "required": list(_BATCH_PROPERTIES), "properties": _BATCH_PROPERTIES},
    "BatchList": _list("Batch"),
    "BatchCreateRequest": {"type": "object", "required": ["input_file_id", "endpoint", "completion_window"],
                           "properties": {"input_file_id": {"type": "string", "maxLength": 64},
                                          "endpoint": {"enum": list(ENDPOINTS)},
                                          "completion_window": {"enum": list(COMPLETION_WINDOWS)},
                                          "metadata": _METADATA}},
}


def components_add(result, generator, request, public):
    """Spectacular postprocessing hook: the Files and Batch APIs' schemas."""
    result.setdefault("components", {}).setdefault("schemas", {}).update(COMPONENTS)
    return result
