"""The whole serving path with real processes, driven by the official `openai` SDK.

uvicorn web process (EMBEDDED_WORKER=0) + one `manage.py run_worker` + Redis
(db 3) + PostgreSQL (database llm_api). The worker runs with two sequences and
a prefetch of two, so four requests saturate it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import httpx
import openai
import pytest
import redis

from inference.api.capacity import LIVE_WORKERS_TTL_S
from tests.e2e.processes import (
    MODEL, api_key_new, database_prepare, postgres_database_reset, process_env, servers_required, usage_record_wait,
    usage_records, wait_until, web_start, worker_start,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DATABASE_URL = os.environ.get("API_E2E_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_api")
REDIS_URL = os.environ.get("API_E2E_REDIS_URL", "redis://127.0.0.1:6379/3")
MESSAGES = [{"role": "user", "content": "Name two oceans."}]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    servers_required(database_url=DATABASE_URL, redis_url=REDIS_URL)
    from inference.queue.redis_backend import RedisJobQueue

    tmp = tmp_path_factory.mktemp("openai_e2e")
    prefix = f"api-e2e-{uuid.uuid4().hex[:8]}"
    postgres_database_reset(DATABASE_URL)
    redis.Redis.from_url(REDIS_URL).flushdb()
    env = process_env(DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL, EMBEDDED_WORKER="0", QUEUE_KEY_PREFIX=prefix,
                      SSE_KEEPALIVE_S="1", OMP_NUM_THREADS="1")
    database_prepare(env)
    keys = {name: api_key_new(env, tenant=name, tier=tier)
            for name, tier in [("free-a", "free"), ("free-b", "free"), ("ent", "enterprise"), ("pro", "pro")]}
    queue = RedisJobQueue(url=REDIS_URL, prefix=prefix)
    worker = worker_start(env, tmp, extra=("--max-num-seqs", "2"))
    web, url = web_start(env, tmp)
    try:
        wait_until(lambda: [w for w in queue.live_workers(MODEL) if w.get("status") == "serving"] or not worker.alive,
                   timeout=240, what="the worker to load the model")
        assert worker.alive, worker.log_tail()
        yield {"url": url, "keys": keys, "queue": queue, "worker": worker, "web": web, "env": env}
    finally:
        web.stop()
        worker.stop()
        queue.flush()


def sdk(stack, key: str = "pro", cls=openai.OpenAI):
    return cls(base_url=f"{stack['url']}/v1", api_key=stack["keys"][key], max_retries=0, timeout=300)


def test_chat_non_streaming(stack):
    raw = sdk(stack).chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=16, temperature=0)
    completion = raw.parse()
    request_id = raw.headers["x-request-id"]
    assert completion.id == f"chatcmpl-{request_id}" and completion.choices[0].message.content
    [record] = usage_record_wait(DATABASE_URL, request_id)
    assert record["completion_tokens"] == completion.usage.completion_tokens
    assert record["prompt_tokens"] == completion.usage.prompt_tokens and record["tier"] == "pro"


def test_streaming_with_usage_matches_non_streaming(stack):
    client = sdk(stack)
    params = dict(model=MODEL, messages=[{"role": "user", "content": "Describe a cat in one sentence."}],
                  max_tokens=30, temperature=0.7, seed=99)
    client.chat.completions.create(**params)  # warm the prefix cache (see the embedded test)
    whole = client.chat.completions.create(**params)
    stream = client.chat.completions.create(**params, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole.choices[0].message.content
    [record] = usage_record_wait(DATABASE_URL, stream.response.headers["x-request-id"])
    assert record["completion_tokens"] == chunks[-1].usage.completion_tokens


def test_completions(stack):
    client = sdk(stack)
    whole = client.completions.create(model=MODEL, prompt="Water boils at", max_tokens=10, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text
    chunks = list(client.completions.create(model=MODEL, prompt="Water boils at", max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_closing_a_stream_aborts_the_engine_request(stack):
    stream = sdk(stack).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a very long essay on rivers."}],
        max_tokens=400, stream=True, extra_body={"ignore_eos": True})
    request_id = stream.response.headers["x-request-id"]
    received = 0
    for chunk in stream:
        received += bool(chunk.choices and chunk.choices[0].delta.content)
        if received == 4:
            break
    stream.close()
    [record] = usage_record_wait(DATABASE_URL, request_id)
    assert record["finish_reason"] == "abort" and 4 <= record["completion_tokens"] < 400
    assert len(usage_records(DATABASE_URL, request_id)) == 1

    def idle():  # the worker's next heartbeats: nothing running or waiting in the engine
        return [w for w in stack["queue"].live_workers(MODEL) if w.get("running") == 0 and w.get("waiting") == 0]

    wait_until(idle, timeout=15, what="the aborted request to leave the engine")


async def test_enterprise_requests_queued_after_free_ones_start_first(stack):
    client = sdk(stack, cls=openai.AsyncOpenAI)
    queue = stack["queue"]
    first_token: dict[str, float] = {}

    async def run(name: str, key: str, max_tokens: int) -> None:
        stream = await client.with_options(api_key=stack["keys"][key]).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Story number {name}, please."}],
            max_tokens=max_tokens, stream=True, extra_body={"ignore_eos": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and name not in first_token:
                first_token[name] = time.monotonic()

    async def until(predicate, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(predicate):
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {queue.depths(MODEL)} {first_token}"
            await asyncio.sleep(0.05)

    # four long free requests fill the worker: two running, two prefetched into its engine
    tasks = [asyncio.create_task(run(f"A{i}", "free-a", 200)) for i in range(4)]
    await until(lambda: len(first_token) >= 2 and queue.depth(MODEL, "free") == 0, "A to run")
    assert len(first_token) == 2, f"all four long requests started at once: {first_token}"
    tasks += [asyncio.create_task(run(f"B{i}", "free-b", 4)) for i in range(2)]
    await until(lambda: queue.depth(MODEL, "free") == 2, "B to queue")
    tasks += [asyncio.create_task(run(f"E{i}", "ent", 4)) for i in range(2)]
    await until(lambda: queue.depth(MODEL, "enterprise") == 2, "E to queue")
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=600)
    assert max(first_token["E0"], first_token["E1"]) < min(first_token["B0"], first_token["B1"]), first_token
    await client.close()


def test_error_paths(stack):
    client = sdk(stack)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert caught.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=5)
    assert caught.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(stack, "free-a").completions.create(model=MODEL, prompt="word " * 5000, max_tokens=5)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{stack['url']}/v1", api_key="sk-bad", max_retries=0).models.list()
    response = httpx.post(f"{stack['url']}/v1/completions", content=b"\x00\xff",
                          headers={"Authorization": f"Bearer {stack['keys']['pro']}"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_503_when_no_worker_is_alive(stack):
    """Last: stops the worker (SIGTERM drains it, then it unregisters)."""
    worker, queue = stack["worker"], stack["queue"]
    worker.signal(signal.SIGTERM)
    worker.popen.wait(60)
    wait_until(lambda: not queue.live_workers(MODEL), timeout=30, what="the worker to unregister")
    time.sleep(LIVE_WORKERS_TTL_S + 0.1)  # the web process trusts a live worker for this long
    for call in (
        lambda c: c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2),
        lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=2, stream=True),
    ):
        with pytest.raises(openai.InternalServerError) as caught:
            call(sdk(stack))
        assert caught.value.status_code == 503 and caught.value.code in {"model_unavailable", "no_worker"}
