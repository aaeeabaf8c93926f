"""JSON request bodies with a nesting limit: one loader for DRF, the completion views and the WebSocket frames.

`json.loads` recurses once per nested array or object; 50,000 `[` make it
raise RecursionError, which DRF's JSONParser does not catch (a 500), and a
body a few hundred levels deep that does parse can still overflow whatever
walks it next (serializers, `copy.deepcopy`, `json.dumps`). No request of
this API nests anywhere near MAX_DEPTH levels, so deeper bodies are refused
with a 400 in the OpenAI shape (`invalid_json`), whoever parses them.

The check costs next to nothing on an ordinary body: the parsed value is
walked level by level (no recursion), and a request has few containers (a
2 KB chat body: 5, walked in 1-2 us; its size does not matter, only how many
arrays and objects it holds). A body too deep for the parser itself is stopped
by the parser's own recursion guard (RecursionError) long before it could use
up the stack, and refused the same way. `benchmarks/json_body.py` measures the
cost against plain `json.loads`.

Pure Python (no Django): DRF's parser built on it is common.json_parser.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64


class JsonBodyError(ValueError):
    """The body is not JSON this API accepts; `str()` says why, for the client."""


def _reject_constant(name: str) -> Any:
    # json accepts NaN / Infinity / -Infinity literals; OpenAI's API (and JSON) does not.
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)  # one, not one per call (json.loads with arguments)


def _too_deep(max_depth: int) -> JsonBodyError:
    return JsonBodyError(f"the JSON nests arrays and objects more than {max_depth} levels deep")


def _depth_exceeds(value: Any, max_depth: int) -> bool:
    """True when `value` (what the decoder made: dicts, lists, scalars) nests containers more than `max_depth`
    levels deep; level by level, no recursion."""
    level, depth = [value], 1
    while level:
        if depth > max_depth:
            return True
        level = [child for item in level for child in (item.values() if type(item) is dict else item)
                 if type(child) is dict or type(child) is list]
        depth += 1
    return False


def json_loads(raw: bytes | bytearray | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` (UTF-8 bytes or text) as strict JSON nested at most `max_depth` levels deep.

    Raises JsonBodyError (a ValueError) for anything else: invalid UTF-8, invalid JSON, NaN/Infinity,
    or nesting deeper than `max_depth`.
    """
    if isinstance(raw, (bytes, bytearray)):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raise JsonBodyError("the body is not valid UTF-8") from None
    else:
        text = raw
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:  # JSONDecodeError included
        raise JsonBodyError(_short(exc)) from None
    if (type(value) is dict or type(value) is list) and _depth_exceeds(value, max_depth):
        raise _too_deep(max_depth)
    return value


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
