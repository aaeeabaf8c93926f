"""Text the database can keep as it is: PostgreSQL refuses NUL in text and in jsonb, and a lone surrogate (which a
JSON escape can make: `"\\ud800"`) is no UTF-8. A live request may carry either (its body is never stored); a
batch's line and its results are, so they go through these."""

from __future__ import annotations

import json


def storable(text: str) -> bool:
    """Whether the database can keep `text` as it is: PostgreSQL refuses NUL in text, and a lone surrogate (which
    a JSON escape can make) is no UTF-8."""
    if "\x00" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def printable_copy(text: str) -> str:
    """`text` with NUL and lone surrogates written as escapes: what an error message may quote of a line."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def body_text(body: dict) -> str:
    """The body as JSON text to store: UTF-8 as it is, or ASCII escapes where it holds a lone surrogate."""
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return text if storable(text) else json.dumps(body, separators=(",", ":"))
