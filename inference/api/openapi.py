"""The OpenAPI 3.1 document of /v1, served at /v1/openapi.json.

drf-spectacular describes the DRF views (keys, models, usage, costs,
invoices; their response schemas come from tenants/openapi.py and
billing/openapi.py). The completion endpoints are async Django views, not DRF,
so `document_complete` (a spectacular postprocessing hook) adds them here,
with request bodies that follow inference/api/schemas.py (ranges included),
and gives every operation a `default` response in the OpenAI error shape:
whatever status a request ends in, its body is described.
"""

from __future__ import annotations

from billing.openapi import COMPONENTS as BILLING_COMPONENTS
from inference.api.schemas import (
    MAX_LOGIT_BIAS, MAX_MESSAGES, MAX_STOP, MAX_STOP_CHARS, MAX_TOP_LOGPROBS, MAX_USER_CHARS, SEED_MAX, SEED_MIN,
    SERVICE_TIERS,
)
from inference.engine.structured_spec import MAX_SCHEMA_CHARS, MAX_SCHEMA_DEPTH, MAX_TOOL_CALLS, MAX_TOOLS
from tenants.openapi import COMPONENTS as TENANTS_COMPONENTS
from tenants.openapi import ref

_NUMBER_OR_NULL = {"type": ["number", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}
_TOKEN_ID = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
_STOP = {"anyOf": [{"type": "null"}, {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
                   {"type": "array", "maxItems": MAX_STOP,
                    "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}}]}


def _range(low: float, high: float, kind: str = "number", *, exclusive_low: bool = False) -> dict:
    schema: dict = {"type": [kind, "null"], "maximum": high}
    schema["exclusiveMinimum" if exclusive_low else "minimum"] = low
    return schema


_JSON_SCHEMA_FORMAT = {
    "type": "object", "required": ["name", "schema"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
        "description": {"type": ["string", "null"]},
        "schema": {"type": "object", "description": (
            "The JSON Schema the output follows (required here; OpenAI's API makes it optional). Checked before "
            f"the request is admitted: at most {MAX_SCHEMA_CHARS} characters of JSON and {MAX_SCHEMA_DEPTH} "
            "levels of nesting, and compiled; an invalid schema is a 400 (param response_format).")},
        "strict": {"type": ["boolean", "null"], "description": (
            "true: a schema keyword the grammar cannot enforce (e.g. uniqueItems, not, if/then/else) is a 400 "
            "naming it; false (default): such keywords are ignored, everything else is enforced.")},
    },
}
_RESPONSE_FORMAT = {
    "description": "The output's format, enforced token by token by a grammar (README: Structured outputs). "
                   "On /v1/completions an extension (as vLLM's).",
    "anyOf": [
        {"type": "null"},
        {"type": "object", "required": ["type"], "properties": {"type": {"enum": ["text", "json_object"]}}},
        {"type": "object", "required": ["type", "json_schema"],
         "properties": {"type": {"const": "json_schema"}, "json_schema": _JSON_SCHEMA_FORMAT}},
    ],
}

# Sampling and output fields both endpoints take (inference.api.schemas._common).
_COMMON_FIELDS = {
    "model": {"type": "string", "minLength": 1, "maxLength": 200},
    "max_tokens": {"type": ["integer", "null"], "minimum": 1, "description": "Default: the rest of the context, "
                   "at most the tier's max_output_tokens."},
    "n": {"enum": [1, None], "description": "Only 1 is supported."},
    "stream": {"type": ["boolean", "null"]},
    "stream_options": {"type": ["object", "null"], "description": "Only with stream: true.", "properties": {
        "include_usage": {"type": ["boolean", "null"]}, "include_timing": {"type": ["boolean", "null"]}}},
    "service_tier": {"enum": [*SERVICE_TIERS, None]},
    "temperature": _range(0, 2),
    "top_p": _range(0, 1, exclusive_low=True),
    "top_k": {"type": ["integer", "null"], "minimum": -1},
    "min_p": _range(0, 1),
    "presence_penalty": _range(-2, 2),
    "frequency_penalty": _range(-2, 2),
    "repetition_penalty": _range(0, 2, exclusive_low=True),
    "seed": {"type": ["integer", "null"], "minimum": SEED_MIN, "maximum": SEED_MAX},
    "logit_bias": {"type": ["object", "null"], "maxProperties": MAX_LOGIT_BIAS,
                   "propertyNames": {"pattern": "^[0-9]{1,9}$"},
                   "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    "stop": _STOP,
    "stop_token_ids": {"type": ["array", "null"], "maxItems": 64, "items": _TOKEN_ID},
    "ignore_eos": {"type": ["boolean", "null"]},
    "min_tokens": {"type": ["integer", "null"], "minimum": 0, "description": "At most max_tokens."},
    "user": {"type": ["string", "null"], "maxLength": MAX_USER_CHARS},
    "response_format": _RESPONSE_FORMAT,
}

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
_CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}]}
_TOOL_NAME = {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}
_TOOL_CALL = {  # an assistant message's call, and (with `index`) a streamed delta's
    "type": "object", "required": ["id", "type", "function"],
    "properties": {"id": {"type": "string", "minLength": 1, "maxLength": 256}, "type": {"const": "function"},
                   "function": {"type": "object", "required": ["name", "arguments"], "properties": {
                       "name": {"type": "string"},
                       "arguments": {"type": "string", "description": "The arguments, a JSON object as text."}}}},
}
# Messages (inference.api.schemas._messages, inference.api.tool_calls.ToolHistory): a tool message answers a
# call of the assistant message before it, and every call is answered before the conversation goes on.
_MESSAGE = {"anyOf": [
    {"type": "object", "required": ["role", "content"], "properties": {
        "role": {"enum": ["system", "developer", "user"]}, "content": _CONTENT, "name": {"type": "string"}}},
    {"type": "object", "required": ["role"], "properties": {
        "role": {"const": "assistant"}, "content": {"anyOf": [{"type": "null"}, *_CONTENT["anyOf"]]},
        "name": {"type": "string"}, "tool_calls": {"type": ["array", "null"], "items": _TOOL_CALL}}},
    {"type": "object", "required": ["role", "content", "tool_call_id"], "properties": {
        "role": {"const": "tool"}, "content": _CONTENT, "tool_call_id": {"type": "string"}}},
]}
_TOOL = {
    "type": "object", "required": ["type", "function"],
    "properties": {"type": {"const": "function"}, "function": {
        "type": "object", "required": ["name"],
        "properties": {
            "name": _TOOL_NAME, "description": {"type": ["string", "null"]},
            "parameters": {"type": ["object", "null"], "description": (
                "A JSON Schema of type object (default: no parameters); at most "
                f"{MAX_SCHEMA_CHARS} characters of JSON and {MAX_SCHEMA_DEPTH} levels. With a forced "
                "tool_choice it is compiled before admission: a schema the grammar cannot read is a 400 (param "
                "tools[i].function.parameters).")},
            "strict": {"type": ["boolean", "null"]},
        }}},
}
_TOOL_FIELDS = {
    "tools": {"type": ["array", "null"], "maxItems": MAX_TOOLS, "items": _TOOL, "description": (
        "Functions the model may call (README: Tool calling); listed in the prompt in the model's own tool "
        "format, else a generic <tool_call> format. Function names are unique.")},
    "tool_choice": {"description": "Only with tools. auto (default): the model answers or calls; none: it "
                    "answers; required, or a named function: a call is forced by the grammar.",
                    "anyOf": [{"type": "null"}, {"enum": ["none", "auto", "required"]},
                              {"type": "object", "required": ["type", "function"], "properties": {
                                  "type": {"const": "function"},
                                  "function": {"type": "object", "required": ["name"],
                                               "properties": {"name": _TOOL_NAME}}}}]},
    "parallel_tool_calls": {"type": ["boolean", "null"], "description": "Only with tools. false: at most one "
                            f"call per reply (default true: at most {MAX_TOOL_CALLS})."},
}
_USAGE = {
    "type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {"prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"},
                   "total_tokens": {"type": "integer"},
                   "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}}},
}
_FINISH = {"enum": ["stop", "length", "tool_calls", "abort", "error", None]}


def _completion_object(kind: str, choice: dict) -> dict:
    return {
        "type": "object", "required": ["id", "object", "created", "model", "choices"],
        "properties": {"id": {"type": "string"}, "object": {"const": kind}, "created": {"type": "integer"},
                       "model": {"type": "string"}, "system_fingerprint": {"type": "string"},
                       "service_tier": {"type": ["string", "null"]}, "usage": _USAGE,
                       "choices": {"type": "array", "minItems": 1, "maxItems": 1, "items": choice}},
    }


COMPONENTS = {
    "Error": {
        "type": "object", "required": ["error"],
        "description": "Every error, whatever its status: OpenAI's error shape.",
        "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
        }},
    },
    "Model": {
        "type": "object", "required": ["id", "object", "created", "owned_by"],
        "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                       "owned_by": {"type": "string"},
                       "max_model_len": {"type": "integer", "description": "The model's context length in "
                                         "tokens, prompt and output together (as vLLM reports it)"}},
    },
    "ModelList": {
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": ref("Model")}},
    },
    "ChatCompletionRequest": {
        "type": "object", "required": ["model", "messages"],
        "properties": {
            **_COMMON_FIELDS,
            "messages": {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": _MESSAGE},
            "max_completion_tokens": {"type": ["integer", "null"], "minimum": 1},
            "logprobs": {"type": ["boolean", "null"]},
            "top_logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOP_LOGPROBS,
                             "description": "Needs logprobs: true."},
            "modalities": {"type": ["array", "null"], "items": {"const": "text"}},
            **_TOOL_FIELDS,
        },
    },
    "CompletionRequest": {
        "type": "object", "required": ["model", "prompt"],
        "properties": {
            **_COMMON_FIELDS,
            "prompt": {"anyOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": _TOKEN_ID},
                {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [
                    {"type": "string"}, {"type": "array", "minItems": 1, "items": _TOKEN_ID}]}},
            ]},
            "logprobs": {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
            "echo": {"enum": [False, None]},
            "best_of": {"enum": [1, None]},
            "suffix": {"enum": ["", None]},
        },
    },
    "ChatCompletion": _completion_object("chat.completion", {
        "type": "object", "required": ["index", "message", "finish_reason"],
        "properties": {"index": {"type": "integer"}, "finish_reason": _FINISH,
                       "logprobs": {"type": ["object", "null"]},
                       "message": {"type": "object", "required": ["role", "content"],
                                   "properties": {"role": {"const": "assistant"},
                                                  "content": {"type": ["string", "null"], "description":
                                                              "null when the reply is only tool calls"},
                                                  "refusal": {"type": ["string", "null"]},
                                                  "tool_calls": {"type": "array", "items": _TOOL_CALL}}}},
    }),
    "ChatCompletionChunk": _completion_object("chat.completion.chunk", {
        "description": "A streamed chat chunk (each `data:` event of stream: true). A call's first "
                       "`delta.tool_calls` entry has index, id, type and function.name (arguments \"\"); the "
                       "next ones index and function.arguments pieces; the last chunk's finish_reason is "
                       "tool_calls.",
        "type": "object", "required": ["index", "delta", "finish_reason"],
        "properties": {"index": {"type": "integer"}, "finish_reason": _FINISH,
                       "logprobs": {"type": ["object", "null"]},
                       "delta": {"type": "object", "properties": {
                           "role": {"const": "assistant"}, "content": {"type": ["string", "null"]},
                           "tool_calls": {"type": "array", "items": {
                               "type": "object", "required": ["index"],
                               "properties": {"index": {"type": "integer"}, **_TOOL_CALL["properties"]}}}}}},
    }),
    "TextCompletion": _completion_object("text_completion", {
        "type": "object", "required": ["index", "text", "finish_reason"],
        "properties": {"index": {"type": "integer"}, "text": {"type": "string"}, "finish_reason": _FINISH,
                       "logprobs": {"type": ["object", "null"]}},
    }),
}

# stream: true: server-sent events, described one event at a time (as Schemathesis and OpenAPI 3.2's
# itemSchema read them): `data: <chunk JSON>` per chunk, `: keep-alive` comments while the engine is
# quiet, then `data: [DONE]`; an error after the stream began is one `data: {"error": ...}` event.
_STREAM = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "description": "A chunk object as JSON (chat: "
                            "#/components/schemas/ChatCompletionChunk), or [DONE]"},
                   "event": {"type": "string"}},
}}}


def _completion_operation(*, summary: str, request: str, response: str) -> dict:
    return {
        "operationId": summary.lower().replace(" ", "_"),
        "summary": summary,
        "tags": ["completions"],
        "security": [{"ApiKey": []}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref(request)}}},
        "responses": {"200": {"description": "The completion (stream: true sends server-sent events)", "content": {
            "application/json": {"schema": ref(response)}, **_STREAM}}},
    }


COMPLETION_PATHS = {
    "/v1/chat/completions": {"post": _completion_operation(
        summary="Create chat completion", request="ChatCompletionRequest", response="ChatCompletion")},
    "/v1/completions": {"post": _completion_operation(
        summary="Create completion", request="CompletionRequest", response="TextCompletion")},
}
_DEFAULT_ERROR = {"description": "An error, in the OpenAI shape", "content": {"application/json": {"schema": ref("Error")}}}
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def only_v1_endpoints(endpoints):
    """Spectacular preprocessing hook: the document covers /v1 only."""
    return [endpoint for endpoint in endpoints if endpoint[0].startswith("/v1/")]


def document_complete(result, generator, request, public):
    """Spectacular postprocessing hook: the completion endpoints, the shared components, error responses."""
    result.setdefault("paths", {}).update(COMPLETION_PATHS)
    components = result.setdefault("components", {})
    components.setdefault("schemas", {}).update({**TENANTS_COMPONENTS, **BILLING_COMPONENTS, **COMPONENTS})
    components.setdefault("securitySchemes", {})["ApiKey"] = {
        "type": "http", "scheme": "bearer", "description": "Authorization: Bearer sk-..."}
    for item in result["paths"].values():
        for method in _METHODS:
            operation = item.get(method)
            if operation is not None:
                operation["responses"]["default"] = _DEFAULT_ERROR
    result["paths"] = dict(sorted(result["paths"].items()))
    return result
