"""The prompt of a chat request with tools: the model's own template where it has a tool format we read,
else the generic format below (issue 38). Torch-free.

**The model's template** is used when it references `tools` and writes calls as `<tool_call>` blocks
(Hermes, Qwen2.5, Qwen3: the format inference.api.tool_parser reads). It is rendered as Hugging Face renders
it: `tools=[{"type": "function", "function": {...}}]`, assistant messages with
`tool_calls=[{"id", "type": "function", "function": {"name", "arguments": <a dict>}}]` (arguments parsed from
the client's JSON string, kept a string when it is not a JSON object) and `{"role": "tool", "tool_call_id",
"name", "content"}` messages. A template with another call format (Llama 3.1's bare JSON, Mistral's
`[TOOL_CALLS]`) would need its own parser, so it gets the generic format.

**The generic format** (SmolLM2, Gemma 3, any template without tools), Hermes' and Qwen2.5's spelling so
that models trained on it behave, built from the template's own roles only:

- the tools, in the system message (appended after a blank line to the client's first system message, else
  a system message of its own; a template without a system role folds it into the first user turn):

      # Tools

      You may call one or more functions to assist with the user query.

      You are provided with function signatures within <tools></tools> XML tags:
      <tools>
      {"type": "function", "function": {"name": "get_weather", ...}}      (one line per tool)
      </tools>

      For each function call, return a json object with function name and arguments within
      <tool_call></tool_call> XML tags:
      <tool_call>
      {"name": <function-name>, "arguments": <args-json-object>}
      </tool_call>

  (the penultimate instruction is one line in the prompt);
- an assistant message's calls: its text (if any), a newline, then one block per call, separated by a newline:
  `<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>` (json.dumps'
  separators: the grammar of a forced call writes exactly this);
- tool results: a user turn of `<tool_response>\\n<content>\\n</tool_response>` blocks, one per result,
  separated by a newline; consecutive results share one turn, and a user message right after them joins
  it after a blank line (templates such as Gemma's insist on alternating roles).
"""

from __future__ import annotations

import json
import re

from inference.engine.chat_template import render_chat_template, template_uses_tools
from inference.engine.structured_spec import MAX_SCHEMA_DEPTH

_TOOLS_HEADER = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                 "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
_TOOLS_FOOTER = ("</tools>\n\nFor each function call, return a json object with function name and arguments "
                 "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                 '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
_CALL_TAG = re.compile(r"<tool_call>")


def tool_format(template: str | None) -> str:
    """"template" when `template` renders tools itself in the `<tool_call>` format, else "generic"."""
    if template and template_uses_tools(template) and _CALL_TAG.search(template):
        return "template"
    return "generic"


def tools_section(tools: list[dict]) -> str:
    """The generic system text that lists `tools` and asks for `<tool_call>` blocks."""
    lines = [json.dumps(tool, ensure_ascii=False) for tool in tools]
    return "\n".join([_TOOLS_HEADER, *lines, _TOOLS_FOOTER])


def call_block(name: str, arguments) -> str:
    """One call as the generic format (and a forced grammar) writes it; `arguments` a dict or JSON text."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": _arguments(arguments)}, ensure_ascii=False) \
        + "\n</tool_call>"


def render_tool_prompt(messages: list[dict], tools: list[dict] | None, template: str, *,
                       bos_token: str | None = None, eos_token: str | None = None,
                       add_generation_prompt: bool = True) -> str:
    """The prompt text for `messages` (normalised by inference.api.tool_calls.ToolHistory) and `tools`
    (ToolSpec.tools; None when tool_choice is "none": the tools are then left out, the history still
    rendered). Raises ChatTemplateError as render_chat_template does."""
    if tool_format(template) == "template":
        return render_chat_template(template, hf_messages(messages), add_generation_prompt=add_generation_prompt,
                                    bos_token=bos_token, eos_token=eos_token, tools=tools or None)
    return render_chat_template(template, generic_messages(messages, tools), bos_token=bos_token,
                                eos_token=eos_token, add_generation_prompt=add_generation_prompt)


def hf_messages(messages: list[dict]) -> list[dict]:
    """Messages as Hugging Face templates read them (arguments as dicts)."""
    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                "name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}}
                for c in message["tool_calls"]]
        if message.get("content") is None:
            message["content"] = ""
        out.append(message)
    return out


def generic_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """Plain {"role", "content"} messages in the generic format (see the module's docstring)."""
    out: list[dict] = []
    from_tool = False  # the last message in `out` is a turn of tool results
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if from_tool:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            from_tool = True
            continue
        if role == "user" and from_tool:
            out[-1]["content"] += "\n\n" + content
            from_tool = False
            continue
        from_tool = False
        if message.get("tool_calls"):
            blocks = "\n".join(call_block(c["function"]["name"], c["function"]["arguments"])
                               for c in message["tool_calls"])
            content = f"{content}\n{blocks}" if content else blocks
        out.append({"role": role, "content": content})
    if tools:
        section = tools_section(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


def _arguments(arguments):
    """A JSON object's text as a dict; anything else (not JSON, not an object, nested past
    MAX_SCHEMA_DEPTH levels: the template's sandbox copies values recursively) as it came."""
    if not isinstance(arguments, str):
        return arguments
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    if not isinstance(value, dict):
        return arguments
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return arguments
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return value
