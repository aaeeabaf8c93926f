"""Response objects in OpenAI's shapes: `chat.completion`, `chat.completion.chunk`,
`text_completion` (whole and streamed), and `usage`.

A chat with tools (tool_choice not "none") reads its reply's text with a
ToolCallParser (inference.api.tool_parser): `message.tool_calls` (`content`
null when the reply is only calls) and `finish_reason: "tool_calls"`; streamed,
`delta.tool_calls` entries in OpenAI's shape (a call's first entry: index, id,
type, function.name and arguments ""; then index and function.arguments pieces).

`service_tier` says how the request was scheduled, in OpenAI's vocabulary (the
SDK's types are a closed set, so a tier name like "pro" would fail strict
clients): tiers with engine priority 0 (enterprise) answer "priority", 1 (pro)
"default", lower ones (free) "flex". The tier is fixed by the API key; a
request's own `service_tier` is validated but does not change scheduling.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache

from inference.api.schemas import CHAT
from inference.api.tool_parser import ToolCallParser
from inference.protocol import Timing, Usage

FINGERPRINT_VERSION = "llm-platform-1"


def service_tier_for(tier) -> str:
    """OpenAI's service_tier value for one of our tiers (see the module docstring)."""
    priority = getattr(tier, "priority", 1)
    if priority <= 0:
        return "priority"
    return "default" if priority == 1 else "flex"


@lru_cache(maxsize=256)  # on every stream chunk
def system_fingerprint(model: str) -> str:
    """The fingerprint of a response whose worker sent none (a worker from before it did)."""
    digest = hashlib.sha256(f"{FINGERPRINT_VERSION}:{model}".encode()).hexdigest()
    return f"fp_{digest[:10]}"


def response_id(*, endpoint: str, request_id: str) -> str:
    return f"chatcmpl-{request_id}" if endpoint == CHAT else f"cmpl-{request_id}"


def usage_body(usage: Usage | None) -> dict:
    """OpenAI `usage` from a job's (inference.protocol.Usage).

    `cost` (an extension, billing's frozen cost: {"currency": "usd", "input",
    "cached_input", "output", "total"} as decimal strings) is passed through
    when the worker priced the request; the openai SDK reads it as
    `usage.model_extra["cost"]`.
    """
    usage = usage or Usage()
    prompt, completion = usage.prompt_tokens, usage.completion_tokens
    body = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    if usage.cost:
        body["cost"] = usage.cost
    return body


def timing_body(timing: Timing | None) -> dict:
    """Extension (`stream_options.include_timing`): the worker's clocks for this request, in seconds.

    queued_s: enqueue to engine start; ttft_s: enqueue to first token; e2e_s:
    enqueue to finish (all from the web process's enqueue time); engine_*: the
    same measured by the engine from its own add_request. benchmarks/serving.py
    subtracts them from client-side latencies to isolate the gateway's share.
    """
    return (timing or Timing()).encode()


def _token_bytes(entry: dict) -> list[int]:
    raw = entry.get("bytes")
    if raw is None:
        return list((entry.get("token") or "").encode("utf-8", "replace"))
    return list(raw)


def chat_logprobs(entries: list[dict]) -> dict:
    """Chat `choices[].logprobs` from the engine's per-token logprob entries."""
    content = []
    for entry in entries:
        content.append(
            {
                "token": entry.get("token", ""),
                "logprob": entry.get("logprob"),
                "bytes": _token_bytes(entry),
                "top_logprobs": [
                    {"token": top.get("token", ""), "logprob": top.get("logprob"), "bytes": _token_bytes(top)}
                    for top in entry.get("top_logprobs") or []
                ],
            }
        )
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[dict], *, start_offset: int = 0) -> dict:
    """Legacy completions `logprobs`: parallel lists, offsets into the generated text."""
    tokens, token_logprobs, top_logprobs, offsets = [], [], [], []
    offset = start_offset
    for entry in entries:
        token = entry.get("token", "")
        tokens.append(token)
        token_logprobs.append(entry.get("logprob"))
        top_logprobs.append({top.get("token", ""): top.get("logprob") for top in entry.get("top_logprobs") or []})
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


@dataclass(slots=True)
class ResponseBuilder:
    """Builds every object of one response, sharing its id, created, model and tier."""

    endpoint: str
    request_id: str
    created: int
    model: str
    service_tier: str
    include_usage: bool = False
    include_timing: bool = False
    want_logprobs: bool = False
    max_tokens_param: str = "max_tokens"  # the name the client used, for error params
    collect: bool = False  # delta_chunk also keeps the text and logprobs for `collected()`
    # the worker's (its engine's weights, dtype, kernels, batch invariance, version; inference.protocol.Delta),
    # set from the first delta; None: the model-name fallback above
    system_fingerprint: str | None = None
    # chat with tools (tool_choice not "none"): the reply's text read for calls (inference.api.tool_parser);
    # content and `delta.tool_calls` come from it, and `tools_finish` ends it
    tool_parser: ToolCallParser | None = None
    finish_reason: str | None = None  # set by finish_chunk ("tool_calls" in place of "stop" when calls came)
    _message: dict | None = None  # the parser's whole message, once it finished
    _offset: int = field(default=0)
    _texts: list[str] = field(default_factory=list)
    _entries: list[dict] = field(default_factory=list)

    @property
    def id(self) -> str:
        return response_id(endpoint=self.endpoint, request_id=self.request_id)

    @property
    def is_chat(self) -> bool:
        return self.endpoint == CHAT

    def _head(self, object_name: str) -> dict:
        return {
            "id": self.id,
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.system_fingerprint or system_fingerprint(self.model),
            "service_tier": self.service_tier,
        }

    def _logprobs(self, entries: list[dict] | None) -> dict | None:
        if not self.want_logprobs or entries is None:
            return None
        if self.is_chat:
            return chat_logprobs(entries)
        result = completion_logprobs(entries, start_offset=self._offset)
        self._offset += sum(len(token) for token in result["tokens"])
        return result

    # ------------------------------------------------------------ whole responses
    def completion(self, *, text: str, finish_reason: str, usage: Usage | None, logprobs: list[dict] | None) -> dict:
        body = self._head("chat.completion" if self.is_chat else "text_completion")
        self._offset = 0
        lp = self._logprobs(logprobs if self.want_logprobs else None)
        if self.is_chat:
            message = {"role": "assistant", "content": text, "refusal": None, "annotations": []}
            if self._message is not None and self._message.get("tool_calls"):
                message["content"] = self._message["content"]
                message["tool_calls"] = self._message["tool_calls"]
            choice = {"index": 0, "message": message, "logprobs": lp, "finish_reason": finish_reason}
        else:
            choice = {"text": text, "index": 0, "logprobs": lp, "finish_reason": finish_reason}
        body["choices"] = [choice]
        body["usage"] = usage_body(usage)
        return body

    def collected(self, *, finish_reason: str, usage: Usage | None) -> dict:
        """The whole response of the content chunks made so far (with `collect`); the finish reason of
        `finish_chunk` when it was made (with tools: "tool_calls" for "stop" when the reply made calls)."""
        finish_reason = self.finish_reason or finish_reason
        return self.completion(text="".join(self._texts), finish_reason=finish_reason, usage=usage,
                               logprobs=self._entries if self.want_logprobs else None)

    # ------------------------------------------------------------ stream chunks
    def _chunk(self, choices: list[dict]) -> dict:
        body = self._head("chat.completion.chunk" if self.is_chat else "text_completion")
        body["choices"] = choices
        if self.include_usage:
            body["usage"] = None
        return body

    def role_chunk(self) -> dict | None:
        """The first chat chunk, carrying the role; completions have none."""
        if not self.is_chat:
            return None
        return self._chunk(
            [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None}, "logprobs": None, "finish_reason": None}]
        )

    def delta_chunk(self, *, text: str, logprobs: list[dict] | None = None) -> dict | None:
        """The chunk of one delta's text; with `tool_parser`, of what the parser lets out of it (content
        and `delta.tool_calls` entries): None when that is nothing and there are no logprobs."""
        calls: list[dict] = []
        if self.tool_parser is not None:
            text, calls = self.tool_parser.feed(text)
            if not text and not calls and not (logprobs and self.want_logprobs):
                return None
        if self.collect:
            self._texts.append(text)
            if logprobs:
                self._entries.extend(logprobs)
        lp = self._logprobs(logprobs)
        if self.is_chat:
            delta = {"content": text} if text or not calls else {}
            if calls:
                delta["tool_calls"] = calls
            return self._chunk([{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": None}])
        return self._chunk([{"text": text, "index": 0, "logprobs": lp, "finish_reason": None}])

    def tools_finish(self, *, finish_reason: str) -> tuple[dict | None, str]:
        """(the chunk of what the tool parser held back, or None; the finish reason to report): "tool_calls"
        in place of "stop" when the reply made calls. Without `tool_parser`: (None, finish_reason)."""
        if self.tool_parser is None:
            return None, finish_reason
        text, calls, self._message, finish_reason = self.tool_parser.finish(finish_reason)
        if not text and not calls:
            return None, finish_reason
        if self.collect:
            self._texts.append(text)
        delta = {"content": text} if text else {}
        if calls:
            delta["tool_calls"] = calls
        return self._chunk([{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]), finish_reason

    def finish_chunk(self, *, finish_reason: str, timing: Timing | None = None) -> dict:
        self.finish_reason = finish_reason
        if self.is_chat:
            body = self._chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}])
        else:
            body = self._chunk([{"text": "", "index": 0, "logprobs": None, "finish_reason": finish_reason}])
        if self.include_timing:
            body["timing"] = timing_body(timing)
        return body

    def usage_chunk(self, *, usage: Usage | None) -> dict:
        body = self._head("chat.completion.chunk" if self.is_chat else "text_completion")
        body["choices"] = []
        body["usage"] = usage_body(usage)
        return body


def response_builder(*, prepared) -> ResponseBuilder:
    request = prepared.request
    tools = request.tools
    parser = ToolCallParser(tools.names, max_calls=tools.max_calls) if request.parses_tool_calls else None
    return ResponseBuilder(
        endpoint=request.endpoint,
        request_id=prepared.request_id,
        created=prepared.created,
        model=prepared.model.name,
        service_tier=service_tier_for(prepared.auth.tier),
        include_usage=request.include_usage,
        include_timing=request.include_timing,
        want_logprobs=request.logprobs is not None,
        max_tokens_param=request.max_tokens_param,
        collect=not request.stream,
        tool_parser=parser,
    )
