"""Raw request bodies to JSON objects, turning every kind of junk into a 400."""

from __future__ import annotations

import json
from typing import Any

from common.errors import InvalidRequest

MAX_BODY_BYTES = 2_621_440  # Django's DATA_UPLOAD_MAX_MEMORY_SIZE default


def _reject_constant(name: str) -> Any:
    # json accepts NaN / Infinity / -Infinity literals; OpenAI's API (and JSON) does not.
    raise ValueError(f"{name} is not valid JSON")


def json_object_parse(*, raw: bytes | str) -> dict:
    """Parse a request body that must hold one JSON object."""
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
        if isinstance(raw, (bytes, bytearray)):
            raw = bytes(raw).decode("utf-8")
        body = json.loads(raw, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidRequest("The request body is not valid UTF-8.", code="invalid_json") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request ({_short(exc)}). "
            "The OpenAI API expects a JSON payload.",
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


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
