"""Raw request bodies to JSON objects, turning every kind of junk into a 400."""

from __future__ import annotations

from typing import Any

from common.errors import InvalidRequest
from common.json_body import JsonBodyError, json_loads

MAX_BODY_BYTES = 2_621_440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE default


def json_object_parse(*, raw: bytes | str) -> dict:
    """Parse a request body that must hold one JSON object (common.json_body's rules: strict JSON, UTF-8,
    nested at most MAX_DEPTH levels)."""
    if isinstance(raw, (bytes, bytearray)) and len(raw) > MAX_BODY_BYTES:
        raise InvalidRequest(
            f"The request body is too large (limit {MAX_BODY_BYTES} bytes).", code="request_too_large", status=413
        )
    if not raw or not raw.strip():
        raise InvalidRequest(
            "We could not parse the JSON body of your request: the body is empty. "
            "The OpenAI API expects a JSON payload.",
            code="invalid_json",
        )
    try:
        body = json_loads(raw)
    except JsonBodyError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request ({exc}). The OpenAI API expects a JSON payload.",
            code="invalid_json",
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"The request body must be a JSON object, not {json_type_name(body)}.", code="invalid_json"
        )
    return body


def json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
