"""Hostile response_format schemas: each is refused with an error a client can be shown (a 400 naming the
problem) or compiles within a bound; none takes more than a few seconds, none stalls the engine.

Cheap bounds come first (StructuredOutput.validate: size, depth, before any compile); the rest is
llguidance's compiler under its fuel limits, run by `check` (torch-free: what the web side can call) and
by the engine's compile pool."""

from __future__ import annotations

import json
import time

import pytest

from inference.engine import EngineValidationError, SamplingParams
from inference.engine.structured_spec import MAX_SCHEMA_DEPTH, StructuredOutput, check
from tests.engine.structured_schemas import TYPICAL


# A hang guard, not a speed check (those are benchmarks/grammar_compile.py's): a bounded compile takes
# milliseconds to about a second on a quiet machine; a shared CI machine may be many times slower.
HANG_S = 30.0

def _deep(levels: int) -> dict:
    schema = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _obj(prop: dict) -> dict:
    return {"type": "object", "properties": {"v": prop}, "required": ["v"], "additionalProperties": False}


def _refused(schema, match: str, strict: bool = True) -> EngineValidationError:
    started = time.perf_counter()
    with pytest.raises(EngineValidationError, match=match) as caught:
        check(StructuredOutput("json_schema", schema, strict))
    assert time.perf_counter() - started < HANG_S
    assert caught.value.param == "response_format"
    return caught.value


@pytest.mark.parametrize("levels", [MAX_SCHEMA_DEPTH, 5000], ids=["past-the-bound", "past-python-recursion"])
def test_deep_nesting_is_refused_before_any_compile(levels):
    params = SamplingParams(structured_output=StructuredOutput("json_schema", _deep(levels)))
    started = time.perf_counter()
    with pytest.raises(EngineValidationError, match="nested too deeply"):
        params.validate()
    assert time.perf_counter() - started < HANG_S


def test_a_huge_schema_is_refused_by_its_size():
    huge_enum = _obj({"enum": [f"value-{i}" for i in range(100_000)]})
    many = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20_000)}}
    for schema in (huge_enum, many):
        started = time.perf_counter()
        with pytest.raises(EngineValidationError, match="too large"):
            StructuredOutput("json_schema", schema).validate()
        assert time.perf_counter() - started < HANG_S


def test_moderate_nesting_and_recursion_compile():
    for schema in (_deep(20), TYPICAL["tree"][0],
                   {"$defs": {"N": {"type": "object", "properties": {"l": {"$ref": "#/$defs/N"},
                                                                     "r": {"$ref": "#/$defs/N"}}}},
                    "$ref": "#/$defs/N"}):
        started = time.perf_counter()
        assert check(StructuredOutput("json_schema", schema, True))
        assert time.perf_counter() - started < HANG_S


@pytest.mark.parametrize("pattern", ["^(a+)+$", "^(a|aa)*c$", "^(a{1,100}){1,100}b{1,1000}$",
                                     "^(.*a.*b.*c.*d.*e.*f.*g.*h.*i.*j)$", "^[a-z]{100000}$"])
def test_pathological_regexes_compile_within_the_bound(pattern):
    started = time.perf_counter()
    assert check(StructuredOutput("json_schema", _obj({"type": "string", "pattern": pattern}), True))
    assert time.perf_counter() - started < HANG_S


@pytest.mark.parametrize("pattern, match", [("^(?=a)a$", "look-around"), ("^(a)\\1$", "backreferences"),
                                            ("^[a-", "regex parse error")])
def test_regexes_it_cannot_enforce_are_refused(pattern, match):
    _refused(_obj({"type": "string", "pattern": pattern}), match)


def test_keywords_it_cannot_enforce_are_named_unless_not_strict():
    schema = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True},
                                               "n": {"not": {"type": "string"}}}}
    error = _refused(schema, "cannot be enforced")
    assert "uniqueItems" in error.message and "not" in error.message
    assert check(StructuredOutput("json_schema", schema, strict=False))  # best effort: ignored


@pytest.mark.parametrize("schema, match", [
    ({"allOf": [{"type": "string", "pattern": f".*{c}.*"} for c in "abcdefghijklmnop"]}, "regex"),
    (_obj({"type": "number", "multipleOf": 1e-300}), "multipleOf"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "Invalid JSON schema"),
])
def test_schemas_past_the_fuel_or_invalid_are_refused(schema, match):
    _refused(schema, match)


def test_a_grammar_with_no_document_ends_its_request_and_is_refused_at_once_after(make_engine, tokenizer):
    engine = make_engine()
    endless = StructuredOutput("json_schema", {"$ref": "#"}, True)  # refers to itself, admits nothing
    prompt = tokenizer.encode("{")
    engine.add_request("r", prompt, SamplingParams(max_tokens=4, structured_output=endless))
    outs = []
    started = time.perf_counter()
    while engine.has_unfinished():
        outs += engine.step()
    assert time.perf_counter() - started < HANG_S
    assert [o.finish_reason for o in outs] == ["error"] and "no JSON document" in outs[0].error
    with pytest.raises(EngineValidationError, match="no JSON document"):  # the failure is cached
        engine.add_request("r2", prompt, SamplingParams(max_tokens=4, structured_output=endless))


def test_pathological_patterns_generate_within_the_bound(make_engine, tokenizer):
    engine = make_engine()
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Write the letter a ten times."}])
    specs = [StructuredOutput("json_schema", _obj({"type": "string", "pattern": p}), True)
             for p in ("^(a+)+$", "^(a|aa)*c$", "^(a{1,100}){1,100}b{1,1000}$")]
    # (their masks' cost, 0.05-0.9 ms a step on this machine, is a benchmark's: benchmarks/grammar_compile.py)
    outs = engine.generate([prompt] * 3, [SamplingParams(temperature=0.0, max_tokens=24, structured_output=s)
                                          for s in specs])
    for out in outs:
        assert out.finish_reason in ("stop", "length") and out.delta_text.startswith('{"v": "')


def test_the_engine_names_keywords_it_cannot_enforce_and_ignores_them_when_not_strict(make_engine, tokenizer):
    engine = make_engine()
    schema = _obj({"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 2, "uniqueItems": True})
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Two letters as JSON."}])
    refused = None
    try:  # a failure the compiler has cached (an earlier test compiled this schema) is refused at once
        engine.add_request("strict", prompt, SamplingParams(
            temperature=0.0, max_tokens=30, structured_output=StructuredOutput("json_schema", schema, True)))
    except EngineValidationError as exc:
        refused = exc.message
    engine.add_request("lenient", prompt, SamplingParams(
        temperature=0.0, max_tokens=30, structured_output=StructuredOutput("json_schema", schema, False)))
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    if refused is None:  # compiled off the engine thread: the request ends with the compiler's error
        strict = outs["strict"][-1]
        assert strict.finish_reason == "error"
        refused = strict.error
    assert "cannot be enforced: uniqueItems" in refused
    lenient = outs["lenient"]
    assert lenient[-1].finish_reason == "stop"
    doc = json.loads("".join(o.delta_text for o in lenient))
    assert set(doc) == {"v"} and len(doc["v"]) <= 2 and set(doc["v"]) <= {"x", "y"}
