"""A request's structured-output constraint (`SamplingParams.structured_output`) and its validation.

Torch-free: the web side validates with it (inference.engine.sampling_params is on its import path),
the engine compiles it (inference.engine.structured). Two checks:

- `StructuredOutput.validate()`: the shape and the size bounds, cheap enough for any thread (kind, a
  dict schema, at most MAX_SCHEMA_CHARS of canonical JSON, at most MAX_SCHEMA_DEPTH levels of nesting);
- `check()`: the schema through llguidance's JSON-schema compiler without a tokenizer (bounded by
  llguidance's own fuel limits, milliseconds for typical schemas, about a second at worst): an invalid
  schema, or (strict) keywords it cannot enforce, named, raise EngineValidationError("response_format").

`tool_calls`: the grammar of a reply made only of tool calls (a chat request's `tool_choice` "required" or a
named function; inference.api.tool_calls builds the spec). `schema` is
`{"functions": [{"name", "parameters", "strict"}, ...], "max_calls": N}` and the reply is N' (1 <= N' <= N)
blocks, separated by CALL_SEPARATOR, each exactly

    <tool_call>
    {"name": "<one of the functions>", "arguments": <a JSON object valid against its parameters>}
    </tool_call>

(Hermes' and Qwen's spelling, so a model trained on it writes it). It is llguidance's Lark syntax with one
`%json` per function for the arguments: `tool_calls_lark` writes it.

The grammar has no free whitespace: separators are json.dumps's (", " and ": ") and nothing else, so a
small model cannot loop on newlines and the output is one canonical line. `strict: false` is best effort,
as OpenAI's: keywords llguidance cannot enforce are ignored (its "lenient" mode), the rest is enforced.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from inference.engine.sampling_params import EngineValidationError

KINDS = ("json_object", "json_schema", "tool_calls")
MAX_SCHEMA_CHARS = 100_000  # canonical JSON of the schema (OpenAI's own bound on a schema's strings is 120k)
MAX_SCHEMA_DEPTH = 64  # nesting of the schema document (OpenAI allows 10 levels of objects: ~30 here)
PARAM = "response_format"
TOOLS_PARAM = "tools"  # the param a tool_calls spec's errors name
MAX_TOOLS = 128  # OpenAI's bound on `tools`
MAX_TOOL_CALLS = 8  # calls in one reply when parallel_tool_calls is on
MAX_TOOLS_CHARS = 400_000  # a tool_calls spec: up to 128 functions, each within MAX_SCHEMA_CHARS
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
CALL_OPEN, CALL_CLOSE, CALL_SEPARATOR = "<tool_call>\n", "\n</tool_call>", "\n"
# Fixed separators and no other whitespace. `overrides`, not defaults: a schema's "x-guidance" cannot change them.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: \[([^\]]*)\]")


@dataclass(slots=True)
class StructuredOutput:
    """`json_object`: any JSON object; `json_schema`: a document valid against `schema`. `strict`: keywords
    the grammar cannot enforce are an error (True) or ignored (False, OpenAI's default)."""

    kind: str
    schema: dict | None = None
    strict: bool = False
    _key: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data) -> "StructuredOutput":
        if isinstance(data, StructuredOutput):
            return data
        if not isinstance(data, dict) or set(data) - {"kind", "schema", "strict"} or "kind" not in data:
            raise EngineValidationError("response_format must name a kind (json_object, json_schema or "
                                        "tool_calls)", PARAM)
        return cls(data["kind"], data.get("schema"), data.get("strict", False))

    def to_dict(self) -> dict:
        return {"kind": self.kind, "schema": self.schema, "strict": self.strict}

    def validate(self) -> "StructuredOutput":
        """The shape and the size bounds (no compile); raise EngineValidationError. Sets `key`."""
        if self.kind not in KINDS:
            raise EngineValidationError(f"response_format type must be one of {', '.join(KINDS)}, got {self.kind!r}",
                                        PARAM)
        if not isinstance(self.strict, bool):
            raise EngineValidationError("response_format strict must be a boolean", PARAM)
        if self.kind == "json_object":
            self.schema = None
        elif self.kind == "tool_calls":
            _check_tools(self.schema)
            _check_depth(self.schema, self.param)
        elif not isinstance(self.schema, dict):
            raise EngineValidationError("response_format json_schema needs a schema object", PARAM)
        else:
            _check_depth(self.schema)
        self._key = None
        bound = MAX_TOOLS_CHARS if self.kind == "tool_calls" else MAX_SCHEMA_CHARS
        if len(self.key) > bound:
            raise EngineValidationError(
                f"{self.param} schema is too large ({len(self.key)} characters of JSON; at most {bound})", self.param)
        return self

    @property
    def param(self) -> str:
        """The request parameter this constraint came from (what its errors name)."""
        return TOOLS_PARAM if self.kind == "tool_calls" else PARAM

    @property
    def key(self) -> str:
        """Canonical form, what a compiled grammar is cached under (with the tokenizer): compact JSON in the
        schema's own key order. Not sorted: the order of "properties" is the order the output writes them in
        (a model writes a name before an age better than after), so two orders are two grammars."""
        if self._key is None:
            try:
                schema = json.dumps(self.schema, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise EngineValidationError(f"{self.param} schema is not valid JSON: {exc}", self.param) from None
            self._key = f"{self.kind}|{int(self.strict)}|{schema}"
        return self._key

    def schema_json(self) -> str:
        """The schema as llguidance reads it (JSON text: Python's big integers survive)."""
        return self.key.split("|", 2)[2] if self.kind == "json_schema" else '{"type": "object"}'

    def grammar(self) -> str:
        """llguidance's grammar (JSON text) for this constraint; raise EngineValidationError if the schema is
        not one it can read."""
        import llguidance

        if self.kind == "tool_calls":
            return llguidance.LLMatcher.grammar_from_lark(tool_calls_lark(self.schema))
        options = dict(_JSON_OPTIONS, lenient=not self.strict)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(self.schema_json(), overrides=options)
        except ValueError as exc:
            raise EngineValidationError(f"Invalid JSON schema in response_format: {exc}", PARAM) from None
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # noqa: BLE001 - a Rust panic (pyo3's PanicException derives from
            # BaseException: llguidance 1.9.1 panics quoting some invalid schemas with non-ASCII text) is this
            # client's 400, never an engine thread's death
            raise EngineValidationError(f"Invalid JSON schema in response_format: it could not be compiled "
                                        f"({type(exc).__name__})", PARAM) from None


def check(spec: StructuredOutput, limits=None) -> str:
    """Validate `spec` through llguidance (no tokenizer); return its grammar. Raise EngineValidationError
    naming the keywords it cannot enforce (strict), or why the schema is invalid."""
    import llguidance

    grammar = spec.validate().grammar()
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None, limits=limits)
    if is_error:
        raise grammar_error(messages[0] if messages else "invalid grammar", spec.param)
    return grammar


def grammar_error(message: str, param: str = PARAM) -> EngineValidationError:
    """llguidance's error as a client's: unsupported keywords named, the rest its first line."""
    found = _UNIMPLEMENTED.search(message)
    if found:
        keys = ", ".join(k.strip().strip('"') for k in found.group(1).split(",") if k.strip())
        return EngineValidationError(
            f"{param} json_schema uses JSON Schema keywords that cannot be enforced: {keys} "
            "(with strict false they are ignored)", param)
    lines = [line.strip() for line in message.splitlines() if line.strip()] or ["invalid grammar"]
    first = lines[0]
    if first.startswith("NoExtension"):
        first = "no JSON document satisfies it"
    detail = next((line for line in lines[1:] if line.startswith("error:")), None)  # a regex's parse error
    if detail is not None:
        first = f"{first} {detail[len('error:'):].strip()} (pattern {lines[1]})"
    return EngineValidationError(f"Invalid JSON schema in {param}: {first[:300]}", param)


def tool_calls_lark(schema: dict) -> str:
    """The Lark grammar (llguidance's dialect) of a `tool_calls` spec's reply: 1..max_calls blocks, each one
    function's name (an alternation of literals) and its arguments (`%json`, that function's parameters
    with this module's fixed separators; lenient unless the function is strict)."""
    calls = max(1, schema.get("max_calls", 1))
    lines = ["%llguidance {}",
             f"start: call ({json.dumps(CALL_SEPARATOR)} call){{0,{calls - 1}}}" if calls > 1 else "start: call",
             f"call: {json.dumps(CALL_OPEN)} body {json.dumps(CALL_CLOSE)}",
             "body: " + " | ".join(f"body_{i}" for i in range(len(schema["functions"])))]
    for i, function in enumerate(schema["functions"]):
        head = '{"name": ' + json.dumps(function["name"]) + ', "arguments": '
        parameters = dict(function.get("parameters") or {})
        parameters.setdefault("type", "object")
        parameters["x-guidance"] = dict(_JSON_OPTIONS, lenient=not function.get("strict", False))
        lines.append(f"body_{i}: {json.dumps(head)} args_{i} \"}}\"")
        lines.append(f"args_{i}: %json {json.dumps(parameters, allow_nan=False)}")
    return "\n".join(lines) + "\n"


def _check_tools(schema) -> None:
    """The shape of a tool_calls spec (inference.api.tool_calls has already given the client its precise
    errors; this guards the wire form the worker receives)."""
    def bad(why: str) -> EngineValidationError:
        return EngineValidationError(f"tools: {why}", TOOLS_PARAM)

    if not isinstance(schema, dict) or set(schema) - {"functions", "max_calls"}:
        raise bad("a tool_calls constraint is {functions, max_calls}")
    calls, functions = schema.get("max_calls", 1), schema.get("functions")
    if type(calls) is not int or not 1 <= calls <= MAX_TOOL_CALLS:
        raise bad(f"max_calls must be an integer in [1, {MAX_TOOL_CALLS}]")
    if not isinstance(functions, list) or not 1 <= len(functions) <= MAX_TOOLS:
        raise bad(f"between 1 and {MAX_TOOLS} functions are needed")
    names = set()
    for function in functions:
        if not isinstance(function, dict) or set(function) - {"name", "parameters", "strict"}:
            raise bad("each function is {name, parameters, strict}")
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name) or name in names:
            raise bad(f"function names must be unique and match {TOOL_NAME.pattern} (got {name!r:.80})")
        names.add(name)
        if not isinstance(function.get("parameters", {}), dict) or not isinstance(function.get("strict", False), bool):
            raise bad(f"function {name}: parameters must be an object and strict a boolean")
        if function.get("parameters", {}).get("type", "object") != "object":
            raise bad(f"function {name}: parameters must be a schema of type object")


def _check_depth(schema: dict, param: str = PARAM) -> None:
    """Iterative (a hostile depth must not reach Python's recursion limit in json.dumps)."""
    stack = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise EngineValidationError(f"{param} schema is nested too deeply (more than "
                                        f"{MAX_SCHEMA_DEPTH} levels)", param)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
