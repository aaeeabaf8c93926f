"""Response objects validate strictly against the official SDK's pydantic types."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion import Completion

from inference.api.responses import ResponseBuilder, service_tier_for, usage_body
from inference.api.schemas import CHAT, COMPLETIONS
from inference.protocol import Done, Usage

ENGINE_USAGE = Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=3)
LOGPROBS = [
    {"token_id": 9, "token": "Hi", "logprob": -0.1, "bytes": [72, 105],
     "top_logprobs": [{"token_id": 9, "token": "Hi", "logprob": -0.1, "bytes": [72, 105]},
                      {"token_id": 5, "token": "Yo", "logprob": -2.5, "bytes": [89, 111]}]},
    {"token_id": 11, "token": " there", "logprob": -0.7, "bytes": None, "top_logprobs": []},
]


def builder(endpoint: str, **fields) -> ResponseBuilder:
    return ResponseBuilder(endpoint=endpoint, request_id="abc123", created=1_700_000_000, model="m",
                           service_tier="default", **fields)


def test_usage_body():
    assert usage_body(ENGINE_USAGE) == {
        "prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
        "prompt_tokens_details": {"cached_tokens": 32}, "completion_tokens_details": {"reasoning_tokens": 0},
    }
    assert usage_body(None)["total_tokens"] == 0


def test_chat_completion_shape():
    body = builder(CHAT, want_logprobs=True).completion(text="Hi there", finish_reason="stop", usage=ENGINE_USAGE,
                                                        logprobs=LOGPROBS)
    parsed = ChatCompletion.model_validate(body, strict=True)
    assert parsed.id == "chatcmpl-abc123" and parsed.object == "chat.completion" and parsed.service_tier == "default"
    assert parsed.choices[0].message.content == "Hi there" and parsed.choices[0].finish_reason == "stop"
    content = parsed.choices[0].logprobs.content
    assert [c.token for c in content] == ["Hi", " there"] and content[1].bytes == list(b" there")
    assert [t.token for t in content[0].top_logprobs] == ["Hi", "Yo"]
    assert parsed.usage.prompt_tokens_details.cached_tokens == 32


def test_chat_chunks_shape():
    b = builder(CHAT, include_usage=True)
    chunks = [b.role_chunk(), b.delta_chunk(text="Hi"), b.finish_chunk(finish_reason="length"), b.usage_chunk(usage=ENGINE_USAGE)]
    parsed = [ChatCompletionChunk.model_validate(chunk, strict=True) for chunk in chunks]
    assert parsed[0].choices[0].delta.role == "assistant" and parsed[1].choices[0].delta.content == "Hi"
    assert parsed[2].choices[0].finish_reason == "length"
    assert parsed[3].choices == [] and parsed[3].usage.total_tokens == 43
    assert all("usage" in chunk and chunk["usage"] is None for chunk in chunks[:3])
    assert "usage" not in builder(CHAT).delta_chunk(text="x")  # only with include_usage, like OpenAI


def test_text_completion_shapes_and_offsets():
    b = builder(COMPLETIONS, want_logprobs=True)
    whole = Completion.model_validate(b.completion(text="Hi there", finish_reason="length", usage=ENGINE_USAGE,
                                                   logprobs=LOGPROBS), strict=True)
    assert whole.id == "cmpl-abc123" and whole.object == "text_completion"
    lp = whole.choices[0].logprobs
    assert lp.tokens == ["Hi", " there"] and lp.text_offset == [0, 2] and lp.top_logprobs[0] == {"Hi": -0.1, "Yo": -2.5}
    b = builder(COMPLETIONS, want_logprobs=True)  # one builder per response
    assert b.role_chunk() is None
    first = b.delta_chunk(text="Hi", logprobs=LOGPROBS[:1])
    second = b.delta_chunk(text=" there", logprobs=LOGPROBS[1:])
    assert second["choices"][0]["logprobs"]["text_offset"] == [2]  # offsets continue across chunks
    # OpenAI streams `finish_reason: null` until the end, which the SDK's Completion type does not model
    for chunk in (first, second):
        assert chunk["choices"][0]["finish_reason"] is None and set(chunk["choices"][0]) == {"text", "index", "logprobs", "finish_reason"}
        Completion.model_validate({**chunk, "choices": [{**chunk["choices"][0], "finish_reason": "stop"}]}, strict=True)
    Completion.model_validate(b.finish_chunk(finish_reason="stop"), strict=True)


@pytest.mark.parametrize(("priority", "expected"), [(0, "priority"), (1, "default"), (2, "flex"), (9, "flex")])
def test_service_tier_mapping(priority, expected):
    class Tier:
        pass

    tier = Tier()
    tier.priority = priority
    assert service_tier_for(tier) == expected


@pytest.mark.parametrize(("done", "endpoint", "status", "param"), [
    (Done("r", "stop"), CHAT, None, None),
    (Done("r", "length"), CHAT, None, None),
    (Done("r", "error", error="worker died"), CHAT, 500, None),
    (Done("r", "error", error="prompt too long for this worker", error_param="prompt"), CHAT, 400, "messages"),
    (Done("r", "error", error="prompt too long for this worker", error_param="prompt"), COMPLETIONS, 400, "prompt"),
    (Done("r", "error", error="bad", error_param="top_p"), CHAT, 400, "top_p"),
    (Done("r", "error", error="bad", error_param="top_logprobs"), COMPLETIONS, 400, "logprobs"),
    (Done("r", "abort"), CHAT, 500, None),
])
def test_done_event_errors(done, endpoint, status, param):
    """A Done's error_param (the engine's name) comes back as the client's parameter name, once."""
    from inference.api.job_run import done_error

    error = done_error(done, endpoint=endpoint)
    if status is None:
        assert error is None
    else:
        assert error.status_code == status and error.param == param
        assert "param:" not in error.message
        assert set(error.body()["error"]) == {"message", "type", "param", "code"}
