"""A reply's tool calls, parsed as its text streams (issue 38). Torch-free.

The model calls a function by writing a block (the format of inference.api.tool_prompt and of a forced
call's grammar, Hermes' and Qwen's)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`ToolCallParser.feed(text)` takes each text delta and returns `(content, tool_call_deltas)`: the text to
show as `delta.content` and the `delta.tool_calls` entries in OpenAI's streaming shape: a call's first
entry `{"index", "id", "type": "function", "function": {"name", "arguments": ""}}`, then
`{"index", "function": {"arguments": <piece>}}` as the arguments arrive. `finish(finish_reason)` returns the
last of both and the whole message (`content` None when the reply is only calls) with its finish reason
("tool_calls" in place of "stop" when there are calls). The rules, which depend only on the text and never
on how it was split into deltas (so a stream re-assembled equals the non-streamed message):

- text outside blocks is content. Whitespace is held back until more text follows it: whitespace right
  before a call, and at the end of a reply with calls, is formatting and dropped; any other is content;
- a block is a call as soon as it starts `{"name": "<a given function>", "arguments": {` (any JSON
  whitespace): its id is made and its arguments stream from `{` to the matching `}` (string-aware; an
  unbalanced `<` outside a string ends them, as a block's end would). Whatever follows them up to
  `</tool_call>` is dropped. A block that ends unterminated keeps the arguments written so far;
- a block that does not start so (keys in another order, arguments written as a string) is read whole at
  `</tool_call>` (or at the end of the reply): a JSON object with a given function's `name` and object or
  JSON-text `arguments` is a call, emitted at once; anything else (invalid JSON, an unknown function) stays
  content, tags included, as vLLM's Hermes parser does;
- past `max_calls` calls (1 without parallel_tool_calls) further calls are dropped.
"""

from __future__ import annotations

import json
import re
import secrets
import string

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_ALPHABET = string.ascii_letters + string.digits
_WS = r"[ \t\n\r]*"  # JSON's whitespace
_HEAD = re.compile(f'{_WS}\\{{{_WS}"name"{_WS}:{_WS}"([^"\\\\]*)"{_WS},{_WS}"arguments"{_WS}:{_WS}([^ \t\n\r])')
HEAD_LIMIT = 256  # a call's head is within its block's first 256 characters (names are at most 64)


def new_call_id() -> str:
    """OpenAI's spelling: `call_` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ALPHABET) for _ in range(24))


class ToolCallParser:
    def __init__(self, names, *, max_calls: int | None = None, id_factory=new_call_id) -> None:
        self.names = frozenset(names)
        self.max_calls = max_calls
        self.new_id = id_factory
        self.calls: list[dict] = []
        self.content: list[str] = []
        self._text = ""  # outside a block: not yet content; inside: the block's text after OPEN
        self._seen = 0  # inside a block: how far `_text` has been searched for CLOSE
        self._head_tried = False  # inside a block: the head was looked for in all of its first HEAD_LIMIT chars
        self._space = ""  # whitespace held back: content unless a call follows, or the reply ends with calls
        self._in_block = False
        self._call: dict | None = None  # the call whose arguments are streaming (or whose block is ending)
        self._depth = 0  # of the streaming arguments: -1 before their first character, 0 once complete
        self._in_string = self._escaped = False
        self._out: tuple[list[str], list[dict]] = ([], [])

    # ---- public
    def feed(self, text: str) -> tuple[str, list[dict]]:
        self._text += text
        self._advance()
        return self._take()

    def finish(self, finish_reason: str) -> tuple[str, list[dict], dict, str]:
        """(content, tool_call_deltas, message, finish_reason) at the end of the reply."""
        if self._in_block and self._call is None:
            self._close_block(self._text)
        elif not self._in_block:
            self._say(self._text)
        self._text, self._in_block, self._call = "", False, None
        if not self.calls:
            self._emit(self._space)
        self._space = ""
        content, deltas = self._take()
        text = "".join(self.content)
        message = {"role": "assistant", "content": text}
        if self.calls:
            message["content"] = text or None
            message["tool_calls"] = self.calls
            if finish_reason == "stop":
                finish_reason = "tool_calls"
        return content, deltas, message, finish_reason

    # ---- the state machine
    def _advance(self) -> None:
        while True:
            if not self._in_block:
                at = self._text.find(OPEN)
                if at == -1:
                    keep = _partial_suffix(self._text, OPEN)
                    self._say(self._text[:len(self._text) - keep])
                    self._text = self._text[len(self._text) - keep:]
                    return
                self._say(self._text[:at])
                self._enter(self._text[at + len(OPEN):])
            elif self._call is not None:
                if self._depth:
                    self._stream_arguments()
                    if self._depth:
                        return
                at = self._find_close()
                if at == -1:
                    return
                self._call, self._in_block, self._text = None, False, self._text[at + len(CLOSE):]
            else:
                at = self._find_close()
                if not self._head_tried:
                    end = min(len(self._text) if at == -1 else at, HEAD_LIMIT)
                    self._head_tried = end == HEAD_LIMIT or at != -1
                    head = _HEAD.match(self._text, 0, end)
                    if head and head.group(2) == "{" and head.group(1) in self.names and self._room():
                        self._space = ""
                        self._start_call(head.group(1))
                        self._text, self._seen = self._text[head.start(2):], 0
                        self._depth, self._in_string, self._escaped = -1, False, False
                        continue
                if at == -1:
                    return
                block, self._in_block = self._text[:at], False
                self._text = self._text[at + len(CLOSE):]
                self._close_block(block, closed=True)

    def _enter(self, text: str) -> None:
        self._text, self._in_block, self._seen, self._head_tried = text, True, 0, False

    def _find_close(self) -> int:
        at = self._text.find(CLOSE, self._seen)
        self._seen = max(self._seen, len(self._text) - len(CLOSE) + 1) if at == -1 else at
        return at

    def _stream_arguments(self) -> None:
        text, depth, in_string, escaped = self._text, max(self._depth, 0), self._in_string, self._escaped
        if not text:
            return
        end = len(text)
        for i, ch in enumerate(text):
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch in "{[":
                depth += 1
            elif ch in "}]":
                depth -= 1
                if depth <= 0:
                    end = i + 1
                    break
            elif ch == "<":  # never outside a JSON string: the block ends early, the arguments with it
                depth, end = 0, i
                break
        self._depth, self._in_string, self._escaped = depth, in_string, escaped
        piece, self._text = text[:end], text[end:]
        if piece:
            self._call["function"]["arguments"] += piece
            self._delta({"index": len(self.calls) - 1, "function": {"arguments": piece}})

    def _close_block(self, block: str, closed: bool = False) -> None:
        """A block that did not start as a call, read whole."""
        call = _whole_call(block, self.names)
        if call is not None:
            self._space = ""
            if self._room():
                self._start_call(call[0])
                self._call["function"]["arguments"] = call[1]
                self._delta({"index": len(self.calls) - 1, "function": {"arguments": call[1]}})
                self._call = None
            return
        self._say(OPEN + block + (CLOSE if closed else ""))

    # ---- output
    def _room(self) -> bool:
        return self.max_calls is None or len(self.calls) < self.max_calls

    def _start_call(self, name: str) -> None:
        self._call = {"id": self.new_id(), "type": "function", "function": {"name": name, "arguments": ""}}
        self.calls.append(self._call)
        self._delta({"index": len(self.calls) - 1, "id": self._call["id"], "type": "function",
                     "function": {"name": name, "arguments": ""}})

    def _say(self, text: str) -> None:
        """Content, its trailing whitespace held back."""
        if not text:
            return
        body = text.rstrip()
        if body:
            self._emit(self._space + body)
            self._space = ""
        self._space += text[len(body):]

    def _emit(self, text: str) -> None:
        if text:
            self.content.append(text)
            self._out[0].append(text)

    def _delta(self, delta: dict) -> None:
        deltas = self._out[1]
        last = deltas[-1] if deltas else None
        if last is not None and set(delta) == set(last) == {"index", "function"} and last["index"] == delta["index"]:
            last["function"]["arguments"] += delta["function"]["arguments"]  # one entry per call per feed
            return
        deltas.append(delta)

    def _take(self) -> tuple[str, list[dict]]:
        content, deltas = self._out
        self._out = ([], [])
        return "".join(content), deltas


def _whole_call(block: str, names) -> tuple[str, str] | None:
    try:
        value = json.loads(block)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict) or value.get("name") not in names or set(value) != {"name", "arguments"}:
        return None
    arguments = value["arguments"]
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
        return (value["name"], arguments) if isinstance(parsed, dict) else None
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments, ensure_ascii=False)


def _partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
