"""The frames of /v1/realtime (inference.consumers): their limits, and the checks made before a frame is parsed."""

from __future__ import annotations

from inference.api.parsing import MAX_BODY_BYTES

MAX_CLIENT_ID = 128
# a frame carries a REST body in a small envelope (type, id, endpoint): REST's limit plus room for that
MAX_FRAME_BYTES = MAX_BODY_BYTES + 1024


def valid_client_id(client_id) -> bool:
    return isinstance(client_id, str) and 0 < len(client_id) <= MAX_CLIENT_ID and client_id.isprintable()


def frame_too_large(text: str) -> bool:
    """More than MAX_FRAME_BYTES in UTF-8, decided without encoding unless the length is in doubt."""
    if len(text) > MAX_FRAME_BYTES:
        return True  # at least one byte a character
    if len(text) * 4 <= MAX_FRAME_BYTES:
        return False  # at most four
    return len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES


def header_value(scope: dict, name: bytes) -> str | None:
    for key, value in scope.get("headers") or []:
        if key.lower() == name:
            return value.decode("latin-1")
    return None
