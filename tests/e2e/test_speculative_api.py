"""Speculative decoding through the API, on a real server: an embedded uvicorn process started with
ENGINE_SPECULATIVE=ngram. A copy task streams several tokens a step; the stream, the usage in its last chunk
and the usage record in the database all count the same emitted tokens, a non-streamed body's too, and the
engine's spec_decode counters reach /metrics."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from tests.e2e.processes import MODEL, EmbeddedServer, usage_record_wait
from tests.inference.metrics_helpers import Scrape

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

SOURCE = (Path(__file__).resolve().parents[2] / "inference" / "engine" / "block_manager.py").read_text()[:1200]
MESSAGES = [{"role": "user", "content": "Repeat this code exactly:\n\n" + SOURCE}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = EmbeddedServer(tmp_path_factory.mktemp("speculative_api"), env={"ENGINE_SPECULATIVE": "ngram"})
    try:
        yield server
    finally:
        server.stop()


def test_a_copy_task_streams_runs_of_tokens_billed_as_emitted(server):
    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=600)
    with api.chat.completions.with_streaming_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0, stream=True, logprobs=True,
            stream_options={"include_usage": True}) as response:
        request_id = response.headers["x-request-id"]
        chunks = list(response.parse())
    tokens = [entry.token for c in chunks for choice in c.choices if choice.logprobs and choice.logprobs.content
              for entry in choice.logprobs.content]
    text = "".join(choice.delta.content or "" for c in chunks for choice in c.choices)
    usage = chunks[-1].usage
    assert usage.completion_tokens == len(tokens) and "".join(tokens) == text
    assert any(len(choice.logprobs.content) > 1 for c in chunks for choice in c.choices
               if choice.logprobs and choice.logprobs.content)  # a step emitted several tokens
    [record] = usage_record_wait(server.database_url, request_id)
    assert record["completion_tokens"] == usage.completion_tokens
    raw = api.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=48, temperature=0,
                                                        logprobs=True)
    body = raw.parse()  # (bf16: a prefix-cache hit may round differently from the first prefill; not compared)
    entries = body.choices[0].logprobs.content
    assert body.usage.completion_tokens == len(entries) and "".join(e.token for e in entries) == body.choices[0].message.content
    [record] = usage_record_wait(server.database_url, raw.headers["x-request-id"])
    assert record["completion_tokens"] == body.usage.completion_tokens
    deadline = time.monotonic() + 10  # the engine's counters reach /metrics with the worker's heartbeat
    while True:
        scrape = Scrape.get(server.url)
        accepted = scrape.total("llmp:spec_decode_num_accepted_tokens_total", model_name=MODEL)
        if accepted > 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert 0 < accepted <= scrape.total("llmp:spec_decode_num_draft_tokens_total", model_name=MODEL)
