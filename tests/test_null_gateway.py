"""benchmarks/null_gateway.py (serving.py's loaded floor) speaks the API's streaming protocol to the real SDK."""

import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "null_gateway.py"


@pytest.fixture
def null_gateway():
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--step-ms", "20"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("port "), line
        yield f"http://127.0.0.1:{int(line.split()[1])}/v1"
    finally:
        proc.terminate()
        proc.stdout.close()
        assert proc.wait(timeout=10) == 0  # SIGTERM ends it cleanly


def test_streams_one_chunk_per_step_with_usage_and_timing(null_gateway):
    client = openai.OpenAI(base_url=null_gateway, api_key="sk-null", max_retries=0, timeout=30)
    for max_tokens in (5, 1):  # two requests on one keep-alive connection
        sent = time.perf_counter()
        stream = client.chat.completions.create(
            model="smollm2-135m-instruct", messages=[{"role": "user", "content": "hi"}], max_tokens=max_tokens,
            stream=True, stream_options={"include_usage": True, "include_timing": True})
        contents, arrivals, finish, usage, timing = [], [], None, None, None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                contents.append(chunk.choices[0].delta.content)
                arrivals.append(time.perf_counter())
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            timing = (chunk.model_extra or {}).get("timing") or timing
            usage = chunk.usage or usage
        assert len(contents) == max_tokens
        assert finish == "length"
        assert usage.completion_tokens == max_tokens
        # the server's clock (request read -> first token handed over) fits inside the client's TTFT
        assert 0 <= timing["ttft_s"] <= arrivals[0] - sent
        # one token per 20 ms step: the tokens of a stream come at least a step apart on average
        if max_tokens > 1:
            assert (arrivals[-1] - arrivals[0]) / (max_tokens - 1) >= 0.015


@pytest.mark.parametrize("http_client", ["httpx", "aiohttp"])
def test_serving_closed_loop_over_each_sdk_backend(null_gateway, http_client, monkeypatch):
    """serving.py's phase 1 (the SDK over --http-client, a closed loop) reads every request's figures."""
    import argparse
    import asyncio

    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import serving

    args = argparse.Namespace(url=null_gateway.removesuffix("/v1"), key="sk-null", http_client=http_client, warmup=1,
                              requests=4, concurrency=2, ramp_s=0.0, max_tokens=3, jitter=0.0, seed=0)
    client = serving.sdk_client(args, null_gateway, "sk-null")
    assert isinstance(client._client, openai.DefaultAioHttpClient) == (http_client == "aiohttp")  # its HTTP client
    asyncio.run(client.close())
    prompts = serving.prompts_build(args.warmup + args.requests, 8, args.seed)
    results, wall = asyncio.run(serving.api_phase(args, prompts))
    assert len(results) == 4 and wall > 0
    for stats in results:
        assert stats.tokens == 3 and len(stats.itl_s) == 2
        assert 0 <= stats.server_ttft_s <= stats.ttft_s
    paired = serving.gateway(results, serving.summary(results, wall), None)
    assert paired["paired_overhead_p50_ms"] > 0
