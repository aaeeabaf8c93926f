"""The official `openai` SDK against a real uvicorn process in the embedded mode.

One server per test session (tests/e2e/processes.py): SQLite file in a tmp dir
(its own PostgreSQL database under `make test-postgres`), migrated and
bootstrapped by the management commands, engine thread inside the web process
on the real SmolLM2 model. Usage is checked against the UsageRecord rows the
worker wrote from the engine's own counts.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx
import openai
import pytest

from tests.e2e.processes import MODEL, embedded_server_shared, usage_record_wait, wait_until

pytestmark = [pytest.mark.slow]

HEARTBEAT_S = 1.0  # the worker loop's heartbeat interval (inference.worker.loop)
MESSAGES = [{"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory, pytestconfig):
    return embedded_server_shared(tmp_path_factory, pytestconfig)


def sdk(server, tier: str = "pro", cls=openai.OpenAI):
    return cls(base_url=f"{server.url}/v1", api_key=server.keys[tier], max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def client(server):
    return sdk(server)


@pytest.fixture(scope="module")
def tokenizer():
    from inference.engine.tokenizer import load_tokenizer

    return load_tokenizer(MODEL)


def unique_prompt(words: int = 8) -> str:
    """A prompt that shares no cached prefix block with any other test's."""
    return f"[{uuid.uuid4().hex}] " + " ".join(["Tell me about the sea."] * max(1, words // 5))


def test_chat_non_streaming(client, server, tokenizer):
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0)
    request_id = raw.headers["x-request-id"]
    assert len(request_id) == 32 and int(raw.headers["openai-processing-ms"]) >= 0
    completion = raw.parse()
    assert completion.id == f"chatcmpl-{request_id}"
    assert completion.object == "chat.completion" and completion.model == MODEL
    assert completion.system_fingerprint.startswith("fp_") and completion.service_tier == "default"
    choice = completion.choices[0]
    assert choice.index == 0 and choice.message.role == "assistant" and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage.prompt_tokens == len(tokenizer.encode_chat(MESSAGES))
    assert 0 < usage.completion_tokens <= 24 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.completion_tokens_details.reasoning_tokens == 0
    [record] = usage_record_wait(server.database_url, request_id)
    assert (record["prompt_tokens"], record["completion_tokens"], record["cached_tokens"]) == (
        usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens)
    assert record["finish_reason"] == choice.finish_reason and record["tier"] == "pro"
    assert record["endpoint"] == "chat.completions"
    if choice.finish_reason == "length":
        assert usage.completion_tokens == 24


def test_streamed_deltas_equal_non_streamed_text_for_the_same_seed(client, server):
    params = dict(model=MODEL, messages=[{"role": "user", "content": "Write a haiku about autumn."}],
                  max_tokens=40, temperature=0.9, top_p=0.95, seed=1234)
    # Warm the prefix cache first: in bfloat16 a prefill over a cached prefix gives
    # slightly different logits than a cold one, which can flip a sampled token.
    # Both compared requests then run under the same engine conditions.
    client.chat.completions.create(**params)
    whole = client.chat.completions.create(**params)
    stream = client.chat.completions.create(**params, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    request_id = stream.response.headers["x-request-id"]
    assert {chunk.id for chunk in chunks} == {f"chatcmpl-{request_id}"}
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    *content_chunks, usage_chunk = chunks
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    assert all(chunk.usage is None for chunk in content_chunks)
    finishes = [c.choices[0].finish_reason for c in content_chunks if c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    text = "".join(c.choices[0].delta.content or "" for c in content_chunks)
    assert text == whole.choices[0].message.content
    assert usage_chunk.usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    [record] = usage_record_wait(server.database_url, request_id)
    assert record["completion_tokens"] == usage_chunk.usage.completion_tokens
    assert record["cached_tokens"] == usage_chunk.usage.prompt_tokens_details.cached_tokens


def test_completions_whole_and_streamed(client, server, tokenizer):
    prompt = "The capital of France is"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0.7, seed=5)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.choices[0].text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=True))
    stream = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0.7, seed=5,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    [record] = usage_record_wait(server.database_url, whole.id.removeprefix("cmpl-"))
    assert record["endpoint"] == "completions" and record["completion_tokens"] == whole.usage.completion_tokens


def test_include_timing_extension(client):
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, stream=True,
        stream_options={"include_usage": True, "include_timing": True})
    chunks = list(stream)
    [finish] = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    timing = finish.model_extra["timing"]
    assert 0 <= timing["engine_ttft_s"] <= timing["ttft_s"] <= timing["e2e_s"]
    assert all("timing" not in (c.model_extra or {}) for c in chunks if c is not finish)


def test_token_id_prompt_matches_text_prompt(client, tokenizer):
    ids = tokenizer.encode("One, two, three,", add_special_tokens=True)
    by_text = client.completions.create(model=MODEL, prompt="One, two, three,", max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text and by_ids.usage.prompt_tokens == len(ids)


def test_repeated_long_prompt_hits_the_prefix_cache(client):
    system = unique_prompt(words=250)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Summarise that."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
    assert first.usage.prompt_tokens > 200
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 192  # whole 16-token blocks of the shared prefix
    assert second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


def test_logprobs_shapes(client):
    chat = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3 and isinstance(entry.bytes, list)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
    legacy = client.completions.create(model=MODEL, prompt="Red, green,", max_tokens=5, temperature=0, logprobs=2)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == legacy.usage.completion_tokens
    assert lp.text_offset == sorted(lp.text_offset) and all(len(top) <= 2 for top in lp.top_logprobs)


def test_stop_sequence_is_not_emitted(client):
    completion = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "List five fruits, one per line."}],
        max_tokens=60, temperature=0, stop=["\n"])
    assert "\n" not in completion.choices[0].message.content


def test_service_tier_follows_the_callers_tier(server):
    for tier, expected in [("enterprise", "priority"), ("pro", "default"), ("free", "flex")]:
        completion = sdk(server, tier).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                                               service_tier="auto")
        assert completion.service_tier == expected


def test_keepalive_comments_while_idle(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": unique_prompt(words=1500)}],
            "max_tokens": 2, "stream": True}
    headers = {"Authorization": f"Bearer {server.keys['pro']}"}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=120) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    # ~1,800 prompt tokens prefill in two chunks of up to 1,024 tokens; each chunk's step (~0.35 s at
    # ~2,800 prefill tok/s on a quiet machine, longer under load) outlasts the 0.2 s keep-alive interval
    assert ": keep-alive" in lines
    assert lines[-1] == "data: [DONE]"
    assert all(line == ": keep-alive" or line.startswith("data: ") for line in lines)


def test_closing_a_stream_aborts_and_bills_exactly_the_tokens_the_engine_generated(client, server):
    """An aborted stream pays for the tokens the engine generated: those the client read, plus any in flight
    (generated, sent, not yet read) when the socket closed. The record's count is the engine's own: it equals
    what the engine's generation counter moved by, and is at least what the client saw."""
    from tests.inference.metrics_helpers import Scrape

    def engine_idle(scrape: Scrape) -> bool:
        return scrape.total("llmp:num_requests_running") == 0 and scrape.total("llmp:worker_requests_active") == 0

    def settled():
        """An idle engine whose counters hold still across a heartbeat: a scrape that shows idle gauges
        can still be the beat from before the previous test's request, with its last tokens not yet counted
        (CI once saw the previous test's 2 tokens land inside this test's figures)."""
        first = Scrape.get(server.url)
        if not engine_idle(first):
            return None
        time.sleep(HEARTBEAT_S * 1.5)  # the idle worker loop beats at least once in this time
        second = Scrape.get(server.url)
        same = all(second.total(name, model_name=MODEL) == first.total(name, model_name=MODEL)
                   for name in ("llmp:generation_tokens_total", "llmp:prompt_tokens_total"))
        return second if engine_idle(second) and same else None

    before = wait_until(settled, timeout=60, what="an idle engine with settled counters before the stream")
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me a very long story."}],
        max_tokens=300, temperature=0.8, seed=3, stream=True, extra_body={"ignore_eos": True})
    request_id = stream.response.headers["x-request-id"]
    received = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            received += 1
        if received == 5:
            break
    stream.close()
    [record] = usage_record_wait(server.database_url, request_id)
    assert record["finish_reason"] == "abort"
    assert 5 <= record["completion_tokens"] < 300

    def counted():  # the engine's counters reach /metrics with the worker's next heartbeat
        after = Scrape.get(server.url)
        grown = (after.total("llmp:generation_tokens_total", model_name=MODEL)
                 - before.total("llmp:generation_tokens_total", model_name=MODEL))
        return (after, grown) if engine_idle(after) and grown >= record["completion_tokens"] else None

    after, grown = wait_until(counted, timeout=30, what="the engine's generation counter")
    assert grown == record["completion_tokens"]  # billed = generated, no more and no fewer
    assert (after.total("llmp:billed_tokens_total", kind="output")
            - before.total("llmp:billed_tokens_total", kind="output")) == record["completion_tokens"]
    # the engine is free again: a new request completes normally
    again = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=3)
    assert again.usage.completion_tokens > 0


async def test_concurrent_streams(server):
    client = sdk(server, cls=openai.AsyncOpenAI)

    async def one(i: int) -> tuple[str, int]:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say the number {i}."}], max_tokens=10,
            temperature=0, stream=True, stream_options={"include_usage": True})
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            else:
                usage = chunk.usage
        return text, usage.completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(6)))
    assert all(text and tokens > 0 for text, tokens in results)
    await client.close()


def test_sdk_error_types(client, server):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert caught.value.code == "model_not_found" and caught.value.body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)
    assert caught.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(server, "free").chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100_000)
    assert caught.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="word " * 9000, max_tokens=5)
    assert caught.value.code == "context_length_exceeded" and caught.value.body["param"] == "prompt"
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert caught.value.code == "invalid_api_key"
    response = httpx.post(f"{server.url}/v1/chat/completions", content=b"\xff{junk",
                          headers={"Authorization": f"Bearer {server.keys['pro']}"})
    assert response.status_code == 400 and json.loads(response.content)["error"]["code"] == "invalid_json"
