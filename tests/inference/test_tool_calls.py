"""Tool calling's pure core (issue 38): `tools` / `tool_choice` / `parallel_tool_calls` and tool messages
validated with OpenAI's params, the prompt in the generic format (SmolLM2's and Gemma 3's templates) and in a
Qwen-style template's own, and the streaming parser (every split of a reply gives the same message)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import pytest

from common.errors import InvalidRequest
from inference.api.tool_calls import ToolHistory, atools_check, parse_tools
from inference.api.tool_parser import ToolCallParser, new_call_id
from inference.api.tool_prompt import call_block, render_tool_prompt, tool_format, tools_section
from inference.engine.chat_template import ChatTemplateError

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now"}}
GEMMA = Path(__file__).resolve().parents[2] / "inference" / "chat_templates" / "gemma3.jinja"
QWEN_STYLE = (  # Qwen2.5's tool handling, shortened
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}"
    "\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}\n<|im_start|>assistant\n{{ message.content }}"
    "{%- for tool_call in message.tool_calls %}\n<tool_call>\n{\"name\": \"{{ tool_call.function.name }}\", "
    "\"arguments\": {{ tool_call.function.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>"
    "{%- elif message.role == 'tool' %}\n<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>"
    "{%- else %}\n<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}\n<|im_start|>assistant\n{%- endif %}")

HANG_S = 30.0


def refused(body: dict, param: str, match: str = "") -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_tools(body)
    assert caught.value.param == param, caught.value
    assert re.search(match, str(caught.value.message if hasattr(caught.value, "message") else caught.value))
    return caught.value


@pytest.mark.parametrize("body, param, match", [
    ({"tools": {"a": 1}}, "tools", "expected an array"),
    ({"tools": [WEATHER] * 129}, "tools", "maximum length 128"),
    ({"tools": [1]}, "tools[0]", "expected an object"),
    ({"tools": [{"function": WEATHER["function"]}]}, "tools[0].type", "Missing required"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type", "Supported values are: 'function'"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "Missing required"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "Missing required"),
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools[0].function.name", "pattern"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools[0].function.name", "too long"),
    ({"tools": [NOW, NOW]}, "tools[1].function.name", "unique"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
     "tools[0].function.parameters", "expected an object"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "type: \"object\""),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": "yes"}}]}, "tools[0].function.strict",
     "boolean"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "'none', 'auto', and 'required'"),
    ({"tools": [WEATHER], "tool_choice": 3}, "tool_choice", "expected a string or an object"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name", "not one of the given tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice.function", "Missing required"),
    ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice.type", "'function'"),
    ({"tool_choice": "auto"}, "tool_choice", "only allowed when 'tools' are specified"),
    ({"tools": [], "parallel_tool_calls": False}, "parallel_tool_calls", "only allowed when 'tools'"),
    ({"tools": [WEATHER], "parallel_tool_calls": "no"}, "parallel_tool_calls", "expected a boolean"),
])
def test_validation_names_the_param(body, param, match):
    error = refused(body, param, match)
    assert error.status_code == 400


def test_parse_defaults_and_the_forcing_grammar():
    assert parse_tools({}) is None and parse_tools({"tools": []}) is None and parse_tools({"tools": None}) is None
    spec = parse_tools({"tools": [WEATHER, NOW]})
    assert (spec.choice, spec.name, spec.parallel, spec.names) == ("auto", None, True, ["get_weather", "now"])
    assert spec.tools[1]["function"]["parameters"] == {"type": "object", "properties": {},
                                                       "additionalProperties": False}
    assert spec.structured_output() is None
    assert parse_tools({"tools": [WEATHER], "tool_choice": "none"}).structured_output() is None
    required = parse_tools({"tools": [WEATHER, NOW], "tool_choice": "required"}).structured_output()
    assert required.kind == "tool_calls" and required.schema["max_calls"] == 8
    assert [f["name"] for f in required.schema["functions"]] == ["get_weather", "now"]
    named = parse_tools({"tools": [WEATHER, NOW], "parallel_tool_calls": False,
                         "tool_choice": {"type": "function", "function": {"name": "now"}}})
    assert (named.choice, named.name, named.max_calls) == ("function", "now", 1)
    assert [f["name"] for f in named.structured_output().schema["functions"]] == ["now"]


def test_schemas_are_checked_with_their_param():
    strict = {"type": "function", "function": {"name": "f", "strict": True, "parameters": {
        "type": "object", "properties": {"v": {"type": "array", "uniqueItems": True}}}}}
    spec = parse_tools({"tools": [NOW, strict], "tool_choice": "required"})
    with pytest.raises(InvalidRequest) as caught:
        asyncio.run(atools_check(spec=spec))
    assert caught.value.param == "tools[1].function.parameters" and "uniqueItems" in str(caught.value)
    asyncio.run(atools_check(spec=parse_tools({"tools": [NOW, strict]})))  # auto: no grammar, nothing to compile
    deep = {"type": "integer"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"a": deep}}
    started = time.perf_counter()
    refused({"tools": [{"type": "function", "function": {"name": "f", "parameters": deep}}]},
            "tools[0].function.parameters", "nested too deeply")
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
    refused({"tools": [{"type": "function", "function": {"name": "f", "parameters": huge}}]},
            "tools[0].function.parameters", "too large")
    assert time.perf_counter() - started < HANG_S  # refused before any compile: a hang guard, not a speed check


CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALL2 = {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": "{}"}}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris, and the time?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]},
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    {"role": "user", "content": "Thanks. Summarise."},
]


def normalise(messages: list[dict]) -> list[dict]:
    history = ToolHistory()
    out = [history.message(m, i, role=m["role"], content=m.get("content")) for i, m in enumerate(messages)]
    history.end()
    return out


def test_history_normalises_calls_and_answers():
    out = normalise(CONVERSATION)
    assert out[2] == {"role": "assistant", "content": None, "tool_calls": [CALL, CALL2]}
    assert out[3] == {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "Sunny, 21 C"}


@pytest.mark.parametrize("messages, param, match", [
    ([{"role": "tool", "tool_call_id": "x", "content": "1"}], "messages[0].role", "preceding message"),
    (CONVERSATION[:3] + [{"role": "tool", "content": "1"}], "messages[3].tool_call_id", "Missing required"),
    (CONVERSATION[:3] + [{"role": "tool", "tool_call_id": "call_9", "content": "1"}], "messages[3].tool_call_id",
     "does not answer"),
    (CONVERSATION[:4] + [{"role": "user", "content": "?"}], "messages[2].role", "did not have response.*call_2"),
    (CONVERSATION[:3], "messages[2].role", "call_1, call_2"),
    ([{"role": "assistant", "tool_calls": [CALL, dict(CALL2, id="call_1")]}], "messages[0].tool_calls[1].id",
     "unique"),
    ([{"role": "assistant", "tool_calls": [dict(CALL, function={"name": "f", "arguments": {}})]}],
     "messages[0].tool_calls[0].function.arguments", "expected a string"),
    ([{"role": "assistant", "tool_calls": [{"id": "c"}]}], "messages[0].tool_calls[0].function", "Missing"),
    ([{"role": "assistant", "tool_calls": "x"}], "messages[0].tool_calls", "expected an array"),
])
def test_history_refusals(messages, param, match):
    with pytest.raises(InvalidRequest) as caught:
        normalise(messages)
    assert caught.value.param == param and re.search(match, str(caught.value)), caught.value


@pytest.fixture(scope="module")
def smollm_template() -> str:
    from inference.engine.tokenizer import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct").chat_template


def test_generic_format_with_smollm2(smollm_template):
    assert tool_format(smollm_template) == "generic"
    text = render_tool_prompt(normalise(CONVERSATION), [WEATHER, NOW], smollm_template)
    section = tools_section([WEATHER, NOW])
    assert text == (
        f"<|im_start|>system\nBe brief.\n\n{section}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris, and the time?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nSunny, 21 C\n</tool_response>\n<tool_response>\n12:00\n"
        "</tool_response>\n\nThanks. Summarise.<|im_end|>\n<|im_start|>assistant\n")
    assert json.dumps(WEATHER) in section and "<tool_call></tool_call> XML tags" in section
    plain = render_tool_prompt([{"role": "user", "content": "Hi"}], [NOW], smollm_template)
    assert plain.startswith(f"<|im_start|>system\n{tools_section([NOW])}<|im_end|>\n<|im_start|>user\nHi")
    # tool_choice none: the tools are left out, the history is still rendered
    assert "<tools>" not in render_tool_prompt(normalise(CONVERSATION), None, smollm_template)


def test_generic_format_keeps_gemmas_alternation():
    template = GEMMA.read_text()
    assert tool_format(template) == "generic"
    text = render_tool_prompt(normalise(CONVERSATION), [WEATHER], template, bos_token="<bos>")
    assert text.count("<start_of_turn>user") == 2 and text.count("<start_of_turn>model") == 2
    assert "</tool_response>\n\nThanks. Summarise.<end_of_turn>" in text
    with pytest.raises(ChatTemplateError):  # the template's own rule still holds for the client's messages
        render_tool_prompt([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], None, template)


def test_a_template_with_tools_renders_them_itself():
    assert tool_format(QWEN_STYLE) == "template"
    text = render_tool_prompt(normalise(CONVERSATION), [WEATHER], QWEN_STYLE)
    assert f"<tools>{json.dumps(WEATHER)}" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert "<tool_response>\n12:00\n</tool_response>" in text and "# Tools\n\nYou may call" not in text
    llama_style = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert tool_format(llama_style) == "generic"  # references tools, writes no <tool_call>: not our parser's


def test_call_block_is_the_grammars_spelling():
    assert call_block("f", '{"a": [1, 2]}') == '<tool_call>\n{"name": "f", "arguments": {"a": [1, 2]}}\n</tool_call>'
    assert call_block("f", "not json") == '<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>'
    assert call_block("f", "[" * 100 + "]" * 100).count("[") == 100  # too deep for the sandbox: kept a string


# ---- the parser
REPLIES = [
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris }", "n": [1, {"a": 2}]}}'
    '\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n',
    "Just text, with <tags> and a < sign.  \n",
    '<tool_call>\n{"arguments": {"x": 1}, "name": "now"}\n</tool_call>',
    '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call> after',
    '<tool_call>\n{"name": "now", "arguments": {"a": 1\n</tool_call>rest',
    '<tool_call>{"name": "now", "arguments": "{\\"q\\": 1}"}</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "日本 🙂"}}',  # cut before the block's end
    "<tool_call>\nnot json at all",
    "ends with <tool_ca",
    '{"name": "now", "arguments": {}}',
    '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\nDone.\n<tool_call>\n{"name": "now", '
    '"arguments": {"b": "</tool_call>"}}\n</tool_call>',
]


def run(text: str, pieces: list[str], **kw) -> tuple[str, list[dict], dict, str]:
    counter = iter(range(1000))
    parser = ToolCallParser(["get_weather", "now"], id_factory=lambda: f"call_{next(counter)}", **kw)
    content, deltas = [], []
    for piece in pieces:
        c, d = parser.feed(piece)
        content.append(c)
        deltas += d
    c, d, message, reason = parser.finish("stop")
    return "".join(content) + c, deltas + d, message, reason


def assemble(deltas: list[dict]) -> list[dict]:
    """The calls a client re-assembles from `delta.tool_calls`, checking OpenAI's shape on the way."""
    calls: list[dict] = []
    for delta in deltas:
        if "id" in delta:
            assert delta["index"] == len(calls) and delta["type"] == "function"
            assert delta["function"]["arguments"] == "" and set(delta["function"]) == {"name", "arguments"}
            calls.append({"id": delta["id"], "type": "function", "function": dict(delta["function"])})
        else:
            assert set(delta) == {"index", "function"} and set(delta["function"]) == {"arguments"}
            assert delta["function"]["arguments"]
            calls[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
    return calls


@pytest.mark.parametrize("text", REPLIES)
def test_every_split_gives_the_same_message(text):
    content, deltas, message, reason = run(text, [text])
    assert content == (message["content"] or "") and assemble(deltas) == message.get("tool_calls", [])
    splits = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for pieces in splits:
        got = run(text, pieces)
        assert got[2] == message and got[3] == reason, pieces
        assert got[0] == content and assemble(got[1]) == message.get("tool_calls", []), pieces


def test_what_each_reply_means():
    messages = {text: run(text, [text]) for text in REPLIES}
    first = messages[REPLIES[0]]
    assert first[2]["content"] == "Let me check." and first[3] == "tool_calls"
    assert [json.loads(c["function"]["arguments"]) for c in first[2]["tool_calls"]] == [
        {"city": 'Pa"ris }', "n": [1, {"a": 2}]}, {}]
    assert messages[REPLIES[1]][2] == {"role": "assistant", "content": REPLIES[1]} and messages[REPLIES[1]][3] == "stop"
    assert messages[REPLIES[2]][2]["tool_calls"][0]["function"] == {"name": "now", "arguments": '{"x": 1}'}
    assert messages[REPLIES[3]][2]["content"] == REPLIES[3] and "tool_calls" not in messages[REPLIES[3]][2]
    assert messages[REPLIES[4]][2]["content"] == "rest"
    assert messages[REPLIES[5]][2]["tool_calls"][0]["function"]["arguments"] == '{"q": 1}'
    assert messages[REPLIES[6]][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "日本 🙂"}'
    assert messages[REPLIES[7]][2]["content"] == REPLIES[7]
    assert messages[REPLIES[8]][2]["content"] == REPLIES[8]
    assert messages[REPLIES[9]][2]["content"] == REPLIES[9]  # a bare object is text: calls are in blocks
    last = messages[REPLIES[10]][2]
    assert last["content"] == "\nDone." and json.loads(last["tool_calls"][1]["function"]["arguments"]) == {
        "b": "</tool_call>"}


def test_max_calls_and_finish_reasons():
    _, _, message, reason = run(REPLIES[0], [REPLIES[0]], max_calls=1)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"] and reason == "tool_calls"
    parser = ToolCallParser(["now"])
    parser.feed('<tool_call>\n{"name": "now", "arguments": {"a": "unfinish')
    _, _, message, reason = parser.finish("length")
    assert reason == "length" and message["tool_calls"][0]["function"]["arguments"] == '{"a": "unfinish'
    assert re.fullmatch(r"call_[A-Za-z0-9]{24}", message["tool_calls"][0]["id"])
    assert len({new_call_id() for _ in range(100)}) == 100
