"""OpenAI tool calling, the request side: `tools`, `tool_choice`, `parallel_tool_calls` and the messages that
carry calls back (issue 38). Torch-free and Django-model-free; every failure is an OpenAI-shaped 400 naming
its parameter (inference.api.fields.invalid).

- `parse_tools(body) -> ToolSpec | None`: the three fields, validated. None when the request has no tools.
- `ToolSpec.structured_output()`: the grammar that forces calls (`required`, a named function), a
  StructuredOutput of kind "tool_calls" (inference.engine.structured_spec writes its Lark grammar); None
  for `auto` (the model answers in text or calls) and `none`. `atools_check(spec=)` runs llguidance over each
  function's parameters the grammar uses, through response_format's cached, off-the-event-loop check (what
  the API runs before admission).
- `ToolHistory`: per request, normalises assistant messages with `tool_calls` and `role: "tool"` messages
  (a tool message must answer a call of the assistant message before it; every call must be answered
  before the conversation goes on).

The reply format, the prompt and the parsing of calls: inference.api.tool_prompt, inference.api.tool_parser.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from inference.api.fields import brief, invalid, text_check, type_error
from inference.api.response_format import astructured_check
from inference.engine.sampling_params import EngineValidationError
from inference.engine.structured_spec import (
    MAX_SCHEMA_CHARS, MAX_SCHEMA_DEPTH, MAX_TOOL_CALLS, MAX_TOOLS, TOOL_NAME, StructuredOutput,
)

CHOICES = ("none", "auto", "required")
MAX_CALL_ID_CHARS = 256


@dataclass(slots=True)
class ToolSpec:
    """`tools` as validated ([{"type": "function", "function": {name, description?, parameters, strict?}}],
    parameters defaulted to an empty object schema), `choice` ("none", "auto", "required" or "function"),
    `name` (the named function), `parallel` (parallel_tool_calls, default true)."""

    tools: list[dict]
    choice: str = "auto"
    name: str | None = None
    parallel: bool = True

    @property
    def names(self) -> list[str]:
        return [tool["function"]["name"] for tool in self.tools]

    @property
    def max_calls(self) -> int:
        """Calls one reply may make (the parser keeps no more; the grammar allows no more)."""
        return MAX_TOOL_CALLS if self.parallel else 1

    def forced(self) -> list[dict]:
        """The functions a forced reply chooses among (all for `required`, the named one); [] otherwise."""
        if self.choice == "required":
            return [tool["function"] for tool in self.tools]
        if self.choice == "function":
            return [tool["function"] for tool in self.tools if tool["function"]["name"] == self.name]
        return []

    def structured_output(self) -> StructuredOutput | None:
        forced = self.forced()
        if not forced:
            return None
        functions = [{"name": f["name"], "parameters": f["parameters"], "strict": f.get("strict", False)}
                     for f in forced]
        return StructuredOutput("tool_calls", {"functions": functions, "max_calls": self.max_calls})


def parse_tools(body: dict) -> ToolSpec | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` of a chat body. `tools` null or [] is no tools."""
    raw, choice, parallel = body.get("tools"), body.get("tool_choice"), body.get("parallel_tool_calls")
    if raw is not None and not isinstance(raw, list):
        raise type_error("tools", "an array", raw)
    if parallel is not None and not isinstance(parallel, bool):
        raise type_error("parallel_tool_calls", "a boolean", parallel)
    if not raw:
        for name, value in (("tool_choice", choice), ("parallel_tool_calls", parallel)):
            if value is not None:
                raise invalid(f"Invalid value for '{name}': '{name}' is only allowed when 'tools' are specified.",
                              name)
        return None
    if len(raw) > MAX_TOOLS:
        raise invalid(f"Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, but "
                      f"got an array with length {len(raw)} instead.", "tools", "array_above_max_length")
    tools, seen = [], set()
    for index, tool in enumerate(raw):
        tools.append(_tool(tool, f"tools[{index}]"))
        name = tools[-1]["function"]["name"]
        if name in seen:
            raise invalid(f"Invalid 'tools[{index}].function.name': the function name '{name}' is used by more "
                          "than one tool; names must be unique.", f"tools[{index}].function.name")
        seen.add(name)
    spec = ToolSpec(tools, parallel=True if parallel is None else parallel)
    spec.choice, spec.name = _choice(choice, seen)
    forced = spec.structured_output()
    if forced is not None:
        try:
            forced.validate()  # the size bound of the grammar's wire form
        except EngineValidationError as exc:
            raise invalid(f"Invalid 'tools': {exc.message}", "tools") from None
    return spec


async def atools_check(*, spec: ToolSpec) -> None:
    """llguidance over each forced function's parameters (milliseconds each, about a second at worst), through
    the cached, off-the-loop check of response_format (its pool, its LRU keyed by the schema, its guard against
    llguidance's panics). A schema it cannot read, or a strict one with keywords it cannot enforce, is a 400
    naming `tools[i].function.parameters`; `auto` and `none` force nothing, so nothing is compiled."""
    forced = {f["name"] for f in spec.forced()}
    for index, tool in enumerate(spec.tools):
        function = tool["function"]
        if function["name"] not in forced:
            continue
        try:
            await astructured_check(spec=StructuredOutput("json_schema", function["parameters"],
                                                          function.get("strict", False)))
        except EngineValidationError as exc:
            raise _bad_parameters(function, index, exc) from None


def _bad_parameters(function: dict, index: int, exc: EngineValidationError):
    detail = exc.message.split(": ", 1)[-1]
    return invalid(f"Invalid schema for function '{function['name']}': {detail}",
                   f"tools[{index}].function.parameters", "invalid_function_parameters")


def _tool(tool, param: str) -> dict:
    if not isinstance(tool, dict):
        raise type_error(param, "an object", tool)
    kind = tool.get("type")
    if kind is None:
        raise invalid(f"Missing required parameter: '{param}.type'.", f"{param}.type", "missing_required_parameter")
    if kind != "function":
        raise invalid(f"Invalid value: {brief(kind)}. Supported values are: 'function'.", f"{param}.type")
    function = tool.get("function")
    param = f"{param}.function"
    if function is None:
        raise invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if not isinstance(function, dict):
        raise type_error(param, "an object", function)
    name = function.get("name")
    if name is None:
        raise invalid(f"Missing required parameter: '{param}.name'.", f"{param}.name", "missing_required_parameter")
    text_check(name, f"{param}.name")
    if len(name) > 64:
        raise invalid(f"Invalid '{param}.name': string too long. Expected a string with maximum length 64, but "
                      f"got a string with length {len(name)} instead.", f"{param}.name", "string_above_max_length")
    if not TOOL_NAME.fullmatch(name):
        raise invalid(f"Invalid '{param}.name': string does not match pattern. Expected a string that matches "
                      "the pattern '^[a-zA-Z0-9_-]+$'.", f"{param}.name")
    out = {"name": name}
    if function.get("description") is not None:
        out["description"] = text_check(function["description"], f"{param}.description")
    if function.get("strict") is not None:
        if not isinstance(function["strict"], bool):
            raise type_error(f"{param}.strict", "a boolean", function["strict"])
        out["strict"] = function["strict"]
    out["parameters"] = _parameters(function.get("parameters"), name, f"{param}.parameters")
    return {"type": "function", "function": out}


def _parameters(schema, name: str, param: str) -> dict:
    """A JSON schema of type object, bounded in depth and size (it is rendered into the prompt, and
    compiled when forced). Omitted: a function without parameters."""
    if schema is None:
        return {"type": "object", "properties": {}, "additionalProperties": False}
    if not isinstance(schema, dict):
        raise type_error(param, "an object", schema)
    kind = schema.get("type", "object")
    if kind != "object":
        raise invalid(f"Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', "
                      f"got 'type: {json.dumps(kind)[:60]}'.", param, "invalid_function_parameters")
    stack = [(schema, 1)]
    while stack:  # iterative: a hostile depth must not reach the recursion limit of json.dumps
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise invalid(f"Invalid schema for function '{name}': nested too deeply (more than {MAX_SCHEMA_DEPTH} "
                          "levels).", param, "invalid_function_parameters")
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    try:
        size = len(json.dumps(schema, separators=(",", ":"), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise invalid(f"Invalid schema for function '{name}': {exc}", param, "invalid_function_parameters") from None
    if size > MAX_SCHEMA_CHARS:
        raise invalid(f"Invalid schema for function '{name}': too large ({size} characters of JSON; at most "
                      f"{MAX_SCHEMA_CHARS}).", param, "invalid_function_parameters")
    return schema


def _choice(choice, names: set[str]) -> tuple[str, str | None]:
    if choice is None:
        return "auto", None
    if isinstance(choice, str):
        if choice not in CHOICES:
            raise invalid(f"Invalid value: {brief(choice)}. Supported values are: 'none', 'auto', and 'required'.",
                          "tool_choice")
        return choice, None
    if not isinstance(choice, dict):
        raise type_error("tool_choice", "a string or an object", choice)
    if choice.get("type") != "function":
        raise invalid(f"Invalid value: {brief(choice.get('type'))}. Supported values are: 'function'.",
                      "tool_choice.type")
    function = choice.get("function")
    if not isinstance(function, dict):
        raise invalid("Missing required parameter: 'tool_choice.function'.", "tool_choice.function",
                      "missing_required_parameter")
    name = function.get("name")
    if not isinstance(name, str):
        raise invalid("Missing required parameter: 'tool_choice.function.name'.", "tool_choice.function.name",
                      "missing_required_parameter")
    if name not in names:
        raise invalid(f"Invalid 'tool_choice': function '{brief(name)[1:-1]}' is not one of the given tools.",
                      "tool_choice.function.name")
    return "function", name


class ToolHistory:
    """Normalises a conversation's messages one by one (`message`), then `end()`. Assistant calls become
    {"id", "type": "function", "function": {"name", "arguments"}} (arguments: a string, as sent); a tool
    message becomes {"role": "tool", "tool_call_id", "name", "content"} (name: the function it answers)."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}  # unanswered call id -> function name, of the last assistant turn
        self.pending_at = -1
        self.ids: set[str] = set()

    def message(self, message: dict, index: int, *, role: str, content: str | None) -> dict:
        """`role` already normalised ("system", "user", "assistant", "tool"), `content` the message's text."""
        if role == "tool":
            return self._answer(message, index, content)
        self._unanswered()
        out = {"role": role, "content": content}
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls is not None:
            if not isinstance(calls, list):
                raise type_error(f"messages[{index}].tool_calls", "an array", calls)
            out["tool_calls"] = [self._call(call, f"messages[{index}].tool_calls[{i}]") for i, call in enumerate(calls)]
            self.pending = {c["id"]: c["function"]["name"] for c in out["tool_calls"]}
            self.pending_at = index
            if not out["tool_calls"]:
                del out["tool_calls"]
        return out

    def end(self) -> None:
        self._unanswered()

    def _call(self, call, param: str) -> dict:
        if not isinstance(call, dict):
            raise type_error(param, "an object", call)
        call_id = call.get("id")
        if call_id is None:
            raise invalid(f"Missing required parameter: '{param}.id'.", f"{param}.id", "missing_required_parameter")
        text_check(call_id, f"{param}.id", allow_empty=False)
        if len(call_id) > MAX_CALL_ID_CHARS or call_id in self.ids:
            raise invalid(f"Invalid '{param}.id': ids must be unique and at most {MAX_CALL_ID_CHARS} characters.",
                          f"{param}.id")
        self.ids.add(call_id)
        if call.get("type", "function") != "function":
            raise invalid(f"Invalid value: {brief(call.get('type'))}. Supported values are: 'function'.",
                          f"{param}.type")
        function = call.get("function")
        if not isinstance(function, dict):
            raise invalid(f"Missing required parameter: '{param}.function'.", f"{param}.function",
                          "missing_required_parameter")
        for field in ("name", "arguments"):
            if function.get(field) is None:
                raise invalid(f"Missing required parameter: '{param}.function.{field}'.", f"{param}.function.{field}",
                              "missing_required_parameter")
            text_check(function[field], f"{param}.function.{field}")
        return {"id": call_id, "type": "function",
                "function": {"name": function["name"], "arguments": function["arguments"]}}

    def _answer(self, message: dict, index: int, content: str | None) -> dict:
        param = f"messages[{index}].tool_call_id"
        call_id = message.get("tool_call_id")
        if call_id is None:
            raise invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
        text_check(call_id, param)
        if call_id not in self.pending:
            if not self.pending and call_id not in self.ids:
                raise invalid("Invalid parameter: messages with role 'tool' must be a response to a preceding "
                              "message with 'tool_calls'.", f"messages[{index}].role")
            raise invalid(f"Invalid '{param}': {brief(call_id)} does not answer an unanswered call of the "
                          "assistant message before it.", param)
        name = self.pending.pop(call_id)
        return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content or ""}

    def _unanswered(self) -> None:
        if self.pending:
            ids = ", ".join(self.pending)
            raise invalid("An assistant message with 'tool_calls' must be followed by tool messages responding to "
                          f"each 'tool_call_id'. The following tool_call_ids did not have response messages: {ids}",
                          f"messages[{self.pending_at}].role")
