"""common.json_body: strict JSON nested at most MAX_DEPTH levels, whatever parses it (DRF, the completions, frames)."""

from __future__ import annotations

import io

import pytest
from rest_framework.exceptions import ParseError

from common.json_body import MAX_DEPTH, JsonBodyError, json_loads
from common.json_parser import JsonBodyParser


def _nested(depth: int, *, padding: int = 0) -> bytes:
    return b"[" * (depth - 1) + b'{"a": "' + b"x" * padding + b'"}' + b"]" * (depth - 1)


@pytest.mark.parametrize("padding", [0, 2_000_000])
def test_the_limit_is_exact(padding):
    assert json_loads(_nested(MAX_DEPTH, padding=padding))
    with pytest.raises(JsonBodyError, match="more than 64 levels deep"):
        json_loads(_nested(MAX_DEPTH + 1, padding=padding))


@pytest.mark.parametrize("depth", [900, 50_000])  # parsed then walked; stopped by the parser's own guard
def test_deep_bodies_are_refused_not_raised(depth):
    with pytest.raises(JsonBodyError, match="levels deep"):
        json_loads(b"[" * depth + b"]" * depth)


def test_many_shallow_containers_are_fine():
    body = b'{"messages": [' + b",".join(b'{"role": "user", "content": "x"}' for _ in range(500)) + b"]}"
    assert len(json_loads(body)["messages"]) == 500


@pytest.mark.parametrize("raw, why", [(b'{"a": NaN}', "NaN"), (b'{"a": -Infinity}', "Infinity"),
                                      (b"\xff\xfe{}", "UTF-8"), (b'{"a": ', "Expecting value")])
def test_what_is_not_strict_json_is_refused(raw, why):
    with pytest.raises(JsonBodyError, match=why):
        json_loads(raw)


def test_drfs_parser_turns_every_refusal_into_a_parse_error():
    parser = JsonBodyParser()
    assert parser.parse(io.BytesIO(b'{"name": "ok"}')) == {"name": "ok"}
    for raw in (b"[" * 50_000 + b"]" * 50_000, _nested(MAX_DEPTH + 1), b'{"a": NaN}', b"\xff"):
        with pytest.raises(ParseError):
            parser.parse(io.BytesIO(raw))
