"""Validation of `/v1/chat/completions` and `/v1/completions` request bodies.

Plain functions rather than DRF serializers: the views are async, and every
failure must name the exact OpenAI parameter (`param`, e.g. `messages[2].role`).
Unknown fields are ignored, as OpenAI does; fields we know but cannot honour
(n > 1, the legacy functions/function_call, echo, audio...) are refused with a
400 instead of being silently dropped. `response_format` (text, json_object,
json_schema: inference.api.response_format) is honoured on both endpoints (on
/v1/completions as an extension, as vLLM's); `tools`, `tool_choice`,
`parallel_tool_calls` and the messages that carry calls back (assistant
`tool_calls`, role `tool`) on chat (inference.api.tool_calls). A forced
tool_choice (`required`, a named function) together with a `response_format`:
both are validated, and the forced call wins (its grammar constrains the
reply); with `auto` the response_format constrains the reply (the model can
then not call a tool). Ranges agree with
`SamplingParams.validate`, which the service runs again once the
vocabulary size is known.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from inference.api.fields import Fields, brief, invalid, is_int, is_number, num, text_check, type_error
from inference.api.response_format import response_format_parse
from inference.api.tool_calls import ToolHistory, ToolSpec, parse_tools
from inference.engine.structured_spec import StructuredOutput

CHAT = "chat.completions"
COMPLETIONS = "completions"
ENDPOINTS = (CHAT, COMPLETIONS)

MAX_TOP_LOGPROBS = 20
MAX_STOP = 4
MAX_STOP_CHARS = 512
MAX_LOGIT_BIAS = 1024
MAX_MESSAGES = 4096
MAX_USER_CHARS = 512
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
SERVICE_TIERS = ("auto", "default", "flex", "priority", "scale")
ROLE_ALIASES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
_TOKEN_ID_RE = re.compile(r"\d{1,9}")


@dataclass(slots=True)
class ApiRequest:
    """A validated completion request, for either endpoint."""

    endpoint: str
    model: str
    # chat: [{"role", "content"}], roles normalised; assistant calls and tool results as ToolHistory writes them
    messages: list[dict] | None = None
    prompt: str | None = None  # completions: text prompt
    prompt_token_ids: list[int] | None = None  # completions: pre-tokenised prompt
    max_tokens: int | None = None  # None: the remaining context, capped by the tier
    max_tokens_param: str = "max_tokens"  # which name the client used, for error params
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams kwargs except max_tokens
    stream: bool = False
    include_usage: bool = False
    include_timing: bool = False  # extension: the worker's timing on the last chunk
    logprobs: int | None = None  # None off; k >= 0: chosen token plus the top k
    user: str | None = None
    service_tier: str | None = None
    # response_format as the engine's StructuredOutput (also in `sampling`); None: free text
    response_format: StructuredOutput | None = None
    tools: ToolSpec | None = None  # chat: tools, tool_choice, parallel_tool_calls; None: no tools
    tool_history: bool = False  # chat: the messages hold assistant tool calls or tool results

    @property
    def prompt_param(self) -> str:
        return "messages" if self.endpoint == CHAT else "prompt"

    @property
    def tool_prompt(self) -> bool:
        """The prompt is rendered with inference.api.tool_prompt (tools, or calls in the history)."""
        return self.tools is not None or self.tool_history

    @property
    def parses_tool_calls(self) -> bool:
        """The reply is read for calls (inference.api.tool_parser): tools given, tool_choice not "none"."""
        return self.tools is not None and self.tools.choice != "none"


def api_param(param: str | None, *, endpoint: str, max_tokens_param: str = "max_tokens") -> str | None:
    """The client's name for a request parameter the engine names (EngineValidationError.param, in
    the completions API's terms): a chat prompt is `messages`, a chat's top_logprobs is its own, a
    completion's is `logprobs`, and max_tokens is whichever name the client sent."""
    if param == "prompt":
        return "messages" if endpoint == CHAT else "prompt"
    if param == "top_logprobs" and endpoint != CHAT:
        return "logprobs"
    if param == "max_tokens":
        return max_tokens_param
    return param


# ---------------------------------------------------------------- shared fields
def _stop(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        raise type_error("stop", "a string or an array of strings", value)
    if len(items) > MAX_STOP:
        raise invalid(f"Invalid 'stop': array too long. Expected at most {MAX_STOP} stop sequences, but got {len(items)}.", "stop")
    for index, item in enumerate(items):
        param = "stop" if isinstance(value, str) else f"stop[{index}]"
        text_check(item, param, allow_empty=False)
        if len(item) > MAX_STOP_CHARS:
            raise invalid(f"Invalid '{param}': stop sequences are limited to {MAX_STOP_CHARS} characters.", param)
    return list(items)


def _logit_bias(body: dict) -> dict[int, float] | None:
    value = body.get("logit_bias")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise type_error("logit_bias", "an object mapping token ids to biases", value)
    if len(value) > MAX_LOGIT_BIAS:
        raise invalid(f"Invalid 'logit_bias': at most {MAX_LOGIT_BIAS} entries are allowed.", "logit_bias")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        if not _TOKEN_ID_RE.fullmatch(key):
            raise invalid(f"Invalid 'logit_bias': key {key[:40]!r} is not a token id.", "logit_bias")
        if not is_number(amount) or not math.isfinite(amount) or not -100 <= amount <= 100:
            raise invalid(f"Invalid 'logit_bias': the bias for token {key} must be a number between -100 and 100.", "logit_bias")
        bias[int(key)] = float(amount)
    return bias


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    """(include_usage, include_timing); `include_timing` is our extension (see responses)."""
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not isinstance(options, dict):
        raise type_error("stream_options", "an object", options)
    if not stream:
        raise invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    flags = []
    for name in ("include_usage", "include_timing"):
        value = options.get(name)
        if value is not None and not isinstance(value, bool):
            raise type_error(f"stream_options.{name}", "a boolean", value)
        flags.append(bool(value))
    return flags[0], flags[1]


def _refuse_unsupported(body: dict, checks: dict[str, Any]) -> None:
    """Fields OpenAI knows that we cannot honour: refuse unless at their neutral value."""
    for name, neutral in checks.items():
        value = body.get(name)
        if value is None or value == neutral or (isinstance(neutral, tuple) and value in neutral):
            continue
        raise invalid(f"The parameter '{name}' is not supported by this server (got {brief(value)}).", name, "unsupported_parameter")


def _model(body: dict) -> str:
    model = body.get("model")
    if model is None:
        raise invalid("You must provide a model parameter.", "model", "missing_required_parameter")
    text_check(model, "model", allow_empty=False)
    if len(model) > 200:
        raise invalid("Invalid 'model': string too long.", "model")
    return model


def _max_tokens(f: Fields, endpoint: str) -> tuple[int | None, str]:
    """(max_tokens, the name the client sent it under); a chat's max_completion_tokens wins over max_tokens."""
    max_tokens = f.integer("max_tokens", lo=1)
    if endpoint == CHAT:
        completion_cap = f.integer("max_completion_tokens", lo=1)
        if completion_cap is not None:  # the newer name wins when both are sent
            return completion_cap, "max_completion_tokens"
    return max_tokens, "max_tokens"


def _stop_token_ids(body: dict) -> list[int] | None:
    stop_token_ids = body.get("stop_token_ids")
    if stop_token_ids is None:
        return None
    if not isinstance(stop_token_ids, list) or len(stop_token_ids) > 64 or not all(
        is_int(t) and 0 <= t < 2**31 for t in stop_token_ids
    ):
        raise invalid("Invalid 'stop_token_ids': expected at most 64 token ids.", "stop_token_ids")
    return list(stop_token_ids)


def _sampling(body: dict, f: Fields, max_tokens: int | None) -> dict[str, Any]:
    """The SamplingParams kwargs the body sets (max_tokens aside), checked in the order the fields are read."""
    top_k = f.integer("top_k", lo=-1)
    sampling: dict[str, Any] = {
        "temperature": f.number("temperature", lo=0.0, hi=2.0),
        "top_p": f.number("top_p", lo=0.0, hi=1.0, lo_open=True),
        "top_k": top_k,
        "min_p": f.number("min_p", lo=0.0, hi=1.0),
        "presence_penalty": f.number("presence_penalty", lo=-2.0, hi=2.0),
        "frequency_penalty": f.number("frequency_penalty", lo=-2.0, hi=2.0),
        "repetition_penalty": f.number("repetition_penalty", lo=0.0, hi=2.0, lo_open=True),
        "seed": f.integer("seed", lo=SEED_MIN, hi=SEED_MAX),
        "logit_bias": _logit_bias(body),
        "stop": _stop(body),
        "ignore_eos": f.boolean("ignore_eos"),  # vLLM-style extensions (extra_body)
        "min_tokens": f.integer("min_tokens", lo=0),
        "stop_token_ids": _stop_token_ids(body),
    }
    sampling = {key: value for key, value in sampling.items() if value is not None}
    min_tokens = sampling.get("min_tokens")
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise invalid("Invalid 'min_tokens': must not exceed max_tokens.", "min_tokens")
    return sampling


def _common(body: dict, endpoint: str) -> ApiRequest:
    f = Fields(body)
    model = _model(body)
    max_tokens, max_tokens_param = _max_tokens(f, endpoint)

    n = f.integer("n")
    if n is not None and n != 1:
        raise invalid(f"Invalid 'n': only n=1 is supported, got {num(n)}.", "n")
    stream = bool(f.boolean("stream"))
    include_usage, include_timing = _stream_options(body, stream)

    service_tier = f.string("service_tier")
    if service_tier is not None and service_tier not in SERVICE_TIERS:
        raise invalid(f"Invalid 'service_tier': expected one of {', '.join(SERVICE_TIERS)}.", "service_tier")

    return ApiRequest(
        endpoint=endpoint,
        model=model,
        max_tokens=max_tokens,
        max_tokens_param=max_tokens_param,
        sampling=_sampling(body, f, max_tokens),
        stream=stream,
        include_usage=include_usage,
        include_timing=include_timing,
        user=f.string("user", max_chars=MAX_USER_CHARS),
        service_tier=service_tier,
    )


# ---------------------------------------------------------------- chat
def _message_content(message: dict, index: int, role: str) -> str:
    param = f"messages[{index}].content"
    content = message.get("content")
    if content is None:
        if role == "assistant":  # an assistant turn may carry only tool calls in OpenAI's API
            return ""
        raise invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    if isinstance(content, str):
        return text_check(content, param)
    if not isinstance(content, list):
        raise type_error(param, "a string or an array of content parts", content)
    texts = []
    for part_index, part in enumerate(content):
        part_param = f"{param}[{part_index}]"
        if not isinstance(part, dict):
            raise type_error(part_param, "an object", part)
        kind = part.get("type")
        if kind != "text":
            raise invalid(
                f"Invalid '{part_param}.type': only 'text' content parts are supported, got {brief(kind)}.",
                f"{part_param}.type",
            )
        texts.append(text_check(part.get("text"), f"{part_param}.text"))
    return "".join(texts)


def _messages(body: dict) -> tuple[list[dict], bool]:
    """(the messages normalised, whether they hold tool calls or tool results)."""
    messages = body.get("messages")
    if messages is None:
        raise invalid("Missing required parameter: 'messages'.", "messages", "missing_required_parameter")
    if not isinstance(messages, list):
        raise type_error("messages", "an array", messages)
    if not messages:
        raise invalid("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.", "messages", "empty_array")
    if len(messages) > MAX_MESSAGES:
        raise invalid(f"Invalid 'messages': at most {MAX_MESSAGES} messages are allowed.", "messages")
    normalised, history, with_tools = [], ToolHistory(), False
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise type_error(f"messages[{index}]", "an object", message)
        role = message.get("role")
        role_param = f"messages[{index}].role"
        if role is None:
            raise invalid(f"Missing required parameter: '{role_param}'.", role_param, "missing_required_parameter")
        if not isinstance(role, str):
            raise type_error(role_param, "a string", role)
        if role == "function":
            raise invalid(f"Invalid '{role_param}': the legacy 'function' role is not supported by this server; "
                          "use 'tool'.", role_param, "unsupported_value")
        if role not in ROLE_ALIASES:
            raise invalid(
                f"Invalid value: {brief(role)}. Supported values are: 'system', 'developer', 'user', 'assistant' "
                "and 'tool'.",
                role_param,
            )
        name = message.get("name")
        if name is not None:
            text_check(name, f"messages[{index}].name")
        role = ROLE_ALIASES[role]
        out = history.message(message, index, role=role, content=_message_content(message, index, role))
        with_tools = with_tools or role == "tool" or "tool_calls" in out
        normalised.append(out)
    history.end()
    return normalised, with_tools


def _structured(request: ApiRequest, body: dict) -> None:
    spec = response_format_parse(body=body)
    if spec is not None:
        request.response_format = spec
        request.sampling["structured_output"] = spec
    forced = request.tools.structured_output() if request.tools is not None else None
    if forced is not None:  # required / a named function: the forced call wins over a response_format
        request.sampling["structured_output"] = forced


def chat_request_parse(*, body: dict) -> ApiRequest:
    """Validate a `/v1/chat/completions` body."""
    request = _common(body, CHAT)
    request.messages, request.tool_history = _messages(body)
    f = Fields(body)
    logprobs = f.boolean("logprobs")
    top_logprobs = f.integer("top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise invalid("Invalid 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.", "top_logprobs")
    request.logprobs = (top_logprobs or 0) if logprobs else None
    _refuse_unsupported(body, {"functions": [], "function_call": ("none", "auto"), "audio": None, "prediction": None})
    request.tools = parse_tools(body)
    _structured(request, body)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise invalid("Only the 'text' modality is supported.", "modalities", "unsupported_value")
    return request


# ---------------------------------------------------------------- completions
def _prompt(body: dict) -> tuple[str | None, list[int] | None]:
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
    if isinstance(prompt, str):
        return text_check(prompt, "prompt"), None
    if not isinstance(prompt, list):
        raise type_error("prompt", "a string, an array of strings or an array of token ids", prompt)
    if not prompt:
        raise invalid("Invalid 'prompt': empty array.", "prompt", "empty_array")
    if all(is_int(item) for item in prompt):
        return None, _token_ids(prompt, "prompt")
    if len(prompt) > 1:
        raise invalid("Invalid 'prompt': only one prompt per request is supported (n=1).", "prompt")
    only = prompt[0]
    if isinstance(only, str):
        return text_check(only, "prompt[0]"), None
    if isinstance(only, list) and only and all(is_int(item) for item in only):
        return None, _token_ids(only, "prompt[0]")
    raise type_error("prompt[0]", "a string or an array of token ids", only)


def _token_ids(ids: list[int], param: str) -> list[int]:
    if any(item < 0 or item >= 2**31 for item in ids):
        raise invalid(f"Invalid '{param}': token ids must be non-negative 32-bit integers.", param)
    return list(ids)


def completion_request_parse(*, body: dict) -> ApiRequest:
    """Validate a `/v1/completions` body."""
    request = _common(body, COMPLETIONS)
    request.prompt, request.prompt_token_ids = _prompt(body)
    request.logprobs = Fields(body).integer("logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    _refuse_unsupported(body, {"echo": False, "best_of": 1, "suffix": ("",)})
    _structured(request, body)  # an extension here, as vLLM's (OpenAI's legacy endpoint has no response_format)
    return request


def api_request_parse(*, endpoint: str, body: dict) -> ApiRequest:
    if endpoint == CHAT:
        return chat_request_parse(body=body)
    if endpoint == COMPLETIONS:
        return completion_request_parse(body=body)
    raise invalid(f"Unknown endpoint {brief(endpoint)}; expected 'chat.completions' or 'completions'.", "endpoint")
