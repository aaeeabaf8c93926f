"""Typed, range-checked reads of request fields, raising OpenAI-shaped 400s.

Every failure names the parameter (`param`) and uses OpenAI's codes:
`invalid_type`, `invalid_value`, `missing_required_parameter`.
"""

from __future__ import annotations

import math
from typing import Any

from common.errors import InvalidRequest
from inference.api.parsing import json_type_name


def invalid(message: str, param: str | None, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def type_error(param: str, expected: str, value: Any) -> InvalidRequest:
    return invalid(
        f"Invalid type for '{param}': expected {expected}, but got {json_type_name(value)} instead.",
        param,
        "invalid_type",
    )


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def text_check(value: Any, param: str, *, allow_empty: bool = True) -> str:
    """A string that is valid Unicode (JSON escapes can smuggle in lone surrogates)."""
    if not isinstance(value, str):
        raise type_error(param, "a string", value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"Invalid '{param}': the string is not valid Unicode (lone surrogate).", param) from None
    if not allow_empty and not value:
        raise invalid(f"Invalid '{param}': empty string.", param)
    return value


class Fields:
    """Typed, range-checked access to the optional fields of a request body (null = absent)."""

    def __init__(self, body: dict) -> None:
        self.body = body

    def get(self, name: str) -> Any:
        return self.body.get(name)

    def integer(self, name: str, *, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self.body.get(name)
        if value is None:
            return None
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)  # 5.0 is an integer in JSON Schema terms
        if not is_int(value):
            raise type_error(name, "an integer", value)
        if lo is not None and value < lo:
            raise invalid(f"Invalid '{name}': integer below minimum value. Expected a value >= {lo}, but got {value} instead.", name)
        if hi is not None and value > hi:
            raise invalid(f"Invalid '{name}': integer above maximum value. Expected a value <= {hi}, but got {num(value)} instead.", name)
        return value

    def number(self, name: str, *, lo: float, hi: float | None, lo_open: bool = False) -> float | None:
        value = self.body.get(name)
        if value is None:
            return None
        if not is_number(value):
            raise type_error(name, "a decimal", value)
        value = float(value) if not isinstance(value, float) else value
        if not math.isfinite(value):
            raise invalid(f"Invalid '{name}': expected a finite number.", name)
        if value < lo or (lo_open and value == lo):
            bound = f"> {num(lo)}" if lo_open else f">= {num(lo)}"
            raise invalid(f"Invalid '{name}': decimal below minimum value. Expected a value {bound}, but got {num(value)} instead.", name)
        if hi is not None and value > hi:
            raise invalid(f"Invalid '{name}': decimal above maximum value. Expected a value <= {num(hi)}, but got {num(value)} instead.", name)
        return value

    def boolean(self, name: str) -> bool | None:
        value = self.body.get(name)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise type_error(name, "a boolean", value)
        return value

    def string(self, name: str, *, max_chars: int | None = None) -> str | None:
        value = self.body.get(name)
        if value is None:
            return None
        text_check(value, name)
        if max_chars is not None and len(value) > max_chars:
            raise invalid(f"Invalid '{name}': string too long. Expected at most {max_chars} characters.", name)
        return value


def num(value: float) -> str:
    if isinstance(value, int) and abs(value) > 10**15:
        return f"{value:.3e}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
