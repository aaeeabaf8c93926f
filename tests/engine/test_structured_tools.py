"""The grammar that forces tool calls (issue 38): a `tool_calls` StructuredOutput, llguidance's Lark with one
`%json` per function. Hand-written calls in the generic format are accepted, anything else refused; hostile
tool schemas are refused or compile within a bound; and the real SmolLM2 (float32), greedy and sampled, with
`tool_choice` required or named, parallel on and off, always writes calls that parse and validate."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest

from inference.engine import EngineValidationError, SamplingParams
from inference.engine.structured_spec import MAX_TOOL_CALLS, StructuredOutput, check, tool_calls_lark

# A hang guard, not a speed check (those are benchmarks/grammar_compile.py's): a bounded compile takes
# milliseconds to about a second on a quiet machine; a shared CI machine may be many times slower.
HANG_S = 30.0

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"type": "string", "maxLength": 24},
                          "unit": {"enum": ["celsius", "fahrenheit"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["timezone"],
        "properties": {"timezone": {"type": "string", "pattern": "^[A-Z][a-z]{1,15}/[A-Z][a-z]{1,15}$"}}}
EMPTY = {"type": "object", "properties": {}, "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time in a timezone.",
                                           "parameters": TIME, "strict": True}},
         {"type": "function", "function": {"name": "list_cities", "description": "Cities we know."}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME, "list_cities": EMPTY}


def spec(names=("get_weather", "get_time", "list_cities"), max_calls: int = 1) -> StructuredOutput:
    functions = [{"name": n, "parameters": SCHEMAS[n], "strict": True} for n in names]
    return StructuredOutput("tool_calls", {"functions": functions, "max_calls": max_calls})


def block(name: str, arguments: dict) -> str:
    from inference.api.tool_prompt import call_block

    return call_block(name, json.dumps(arguments))


@pytest.fixture(scope="module")
def matcher_for():
    import llguidance

    from inference.engine.structured import llguidance_tokenizer
    from inference.engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m-instruct")
    ll = llguidance_tokenizer(tokenizer, tokenizer.vocab_size)

    def accepts(s: StructuredOutput, text: str) -> bool:
        matcher = llguidance.LLMatcher(ll, check(s), log_level=0)
        return matcher.consume_tokens(tokenizer.encode(text)) and not matcher.is_error() and matcher.is_accepting()

    return accepts


PARIS = block("get_weather", {"city": "Paris", "unit": "celsius"})
TOKYO = block("get_time", {"timezone": "Asia/Tokyo"})
CITIES = block("list_cities", {})


def test_hand_written_calls_are_accepted_and_others_refused(matcher_for):
    assert PARIS == ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
                     "\n</tool_call>")
    one, three = spec(), spec(max_calls=3)
    for text in (PARIS, TOKYO, CITIES):
        assert matcher_for(one, text) and matcher_for(three, text)
    assert matcher_for(three, f"{PARIS}\n{TOKYO}\n{CITIES}") and not matcher_for(one, f"{PARIS}\n{TOKYO}")
    assert not matcher_for(three, "\n".join([PARIS] * 4))
    refused = [
        block("get_weather", {"city": "Paris", "unit": "kelvin"}),  # outside the enum
        block("get_weather", {"city": "Paris"}),  # a required key missing
        block("get_weather", {"city": "Paris", "unit": "celsius", "extra": 1}),  # additionalProperties false
        block("get_time", {"timezone": "tokyo"}),  # the pattern
        block("get_weather", {"city": "x" * 25, "unit": "celsius"}),  # maxLength
        block("delete_all", {}),  # no such function
        PARIS.replace('", "arguments"', '",  "arguments"'),  # free whitespace
        PARIS.replace("<tool_call>\n", "<tool_call>"),
        "Sure! " + PARIS,  # text before the call
        PARIS + "\n",  # a separator with no call after it
    ]
    for text in refused:
        assert not matcher_for(three, text), text
    named = spec(["get_time"], max_calls=MAX_TOOL_CALLS)
    assert matcher_for(named, f"{TOKYO}\n{TOKYO}") and not matcher_for(named, PARIS)


def test_the_lark_text_and_the_wire_form():
    lark = tool_calls_lark(spec(max_calls=2).schema)
    assert lark.startswith('%llguidance {}\nstart: call ("\\n" call){0,1}\ncall: "<tool_call>\\n" body')
    params = SamplingParams(structured_output=spec(max_calls=2), temperature=0.0, max_tokens=10)
    back = SamplingParams.from_dict(json.loads(json.dumps(params.to_dict())))
    back.validate()
    assert back.structured_output.key == spec(max_calls=2).validate().key and back.structured_output.param == "tools"


@pytest.mark.parametrize("schema, match", [
    ({"functions": []}, "between 1 and 128"),
    ({"functions": [{"name": "a b"}]}, "match"),
    ({"functions": [{"name": "a"}, {"name": "a"}]}, "unique"),
    ({"functions": [{"name": "a"}], "max_calls": 9}, "max_calls"),
    ({"functions": [{"name": "a", "parameters": {"type": "array"}}]}, "type object"),
    ({"functions": [{"name": "a", "parameters": {"type": "object", "properties": {"v": {"type": "array",
                                                 "uniqueItems": True}}}, "strict": True}]}, "uniqueItems"),
    ({"functions": [{"name": "a", "parameters": {"type": "object", "properties": {"v": {
        "type": "string", "pattern": "^(a)\\1$"}}}, "strict": True}]}, "backreferences"),
])
def test_bad_tool_specs_are_refused_naming_tools(schema, match):
    started = time.perf_counter()
    with pytest.raises(EngineValidationError, match=match) as caught:
        check(StructuredOutput("tool_calls", schema))
    assert caught.value.param == "tools" and time.perf_counter() - started < HANG_S


def test_a_function_without_strict_is_best_effort():
    loose = {"type": "object", "properties": {"v": {"type": "array", "uniqueItems": True}}}
    assert check(StructuredOutput("tool_calls", {"functions": [{"name": "a", "parameters": loose}]}))


def test_hostile_text_inside_a_schema_stays_inside_its_json(matcher_for):
    sneaky = {"type": "object", "additionalProperties": False, "required": ["q"], "description":
              '}\nstart: "x"\n%json {"type": "string"} "</tool_call>\\u0000"',
              "properties": {"q": {"const": '"}\n</tool_call>\nbody_0: "pwned"'}}}
    s = StructuredOutput("tool_calls", {"functions": [{"name": "f", "parameters": sneaky}], "max_calls": 1})
    started = time.perf_counter()
    assert matcher_for(s, block("f", {"q": '"}\n</tool_call>\nbody_0: "pwned"'}))
    assert not matcher_for(s, "x") and not matcher_for(s, "pwned")
    deep = {"type": "integer"}
    for _ in range(30):
        deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
    many = [{"name": f"f{i}", "parameters": deep, "strict": True} for i in range(128)]
    assert check(StructuredOutput("tool_calls", {"functions": many, "max_calls": 8}))
    assert time.perf_counter() - started < HANG_S


# ---- the real model
PROMPTS = ["What's the weather like in Paris right now?", "Tell me a joke."]
CHOICES = ["required", {"type": "function", "function": {"name": "get_weather"}}]


@pytest.mark.slow
def test_the_model_always_writes_valid_calls(make_engine, tokenizer):
    """Both kinds of choice, a question the tools answer and one they do not, greedy and seeded-sampled,
    parallel off and on: 16 requests in one batch."""
    from inference.api.tool_calls import ToolHistory, parse_tools
    from inference.api.tool_parser import ToolCallParser
    from inference.api.tool_prompt import render_tool_prompt

    engine = make_engine(kv_cache_mb=384)  # 16 rows of a 341-token prompt (cached once) and their replies
    cases, prompts, params = [], [], []
    for parallel in (False, True):
        for choice in CHOICES:
            tool_spec = parse_tools({"tools": TOOLS, "tool_choice": choice, "parallel_tool_calls": parallel})
            for question in PROMPTS:
                history = ToolHistory()
                messages = [history.message({}, 0, role="user", content=question)]
                text = render_tool_prompt(messages, tool_spec.tools, tokenizer.chat_template,
                                          bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
                for sampling in ({"temperature": 0.0}, {"temperature": 1.0, "seed": 7}):
                    cases.append((tool_spec, choice, question, sampling))
                    prompts.append(tokenizer.encode(text))
                    params.append(SamplingParams(structured_output=tool_spec.structured_output(), max_tokens=512,
                                                 **sampling))
    outputs = engine.generate(prompts, params)
    for (tool_spec, choice, question, sampling), out in zip(cases, outputs):  # every call's strings bounded
        where = (choice, question, sampling, tool_spec.parallel)
        assert out.finish_reason == "stop", where
        parser = ToolCallParser(tool_spec.names, max_calls=tool_spec.max_calls)
        parser.feed(out.delta_text)
        _, _, message, reason = parser.finish(out.finish_reason)
        assert reason == "tool_calls" and message["content"] is None, (where, out.delta_text)
        calls = message["tool_calls"]
        assert 1 <= len(calls) <= tool_spec.max_calls, where
        assert len(calls) == out.delta_text.count("<tool_call>"), where  # none dropped: the grammar's bound
        for call in calls:
            name = call["function"]["name"]
            assert choice == "required" or name == choice["function"]["name"], where
            jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[name])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
