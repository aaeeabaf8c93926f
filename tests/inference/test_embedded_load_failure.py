"""A request waiting for a model whose embedded engine failed to load ends with a 503, never waits for ever
(issue 37: "never a request that waits forever").

The embedded pool says whether a model's queued jobs will still be served (`EmbeddedWorkers.still_served`):
not once its engine thread died at load. A waiting request's liveness check (`JobRun`, every
LIVENESS_INTERVAL_S while no event comes) asks the pool and ends the request with 503 `no_worker` and
Retry-After, cancelling its job. And the whole path with a real engine: a model whose file cannot be loaded
(its tensor data cut short) fails in the engine thread (`embedded._run`), its request ends with that 503, the
next one is refused at once (503 `model_unavailable`, naming the failure), and the process serves its other
model."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from common.errors import ServiceUnavailable
from inference.api import job_run
from inference.api.job_run import JobRun
from inference.worker import embedded
from tests.inference.queue_helpers import OneMailboxReply
from tests.inference.test_api_validation import check, make_key, post  # noqa: F401


@pytest.fixture
def failed_model(monkeypatch):
    """A model whose engine thread has ended after its load failed, as `embedded._run` records it."""
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    monkeypatch.setitem(embedded._workers, "broken-model", (object(), dead))
    monkeypatch.setitem(embedded._load_failures, "broken-model", (time.monotonic(), "unsupported architecture"))
    return "broken-model"


def test_the_pool_says_a_model_that_failed_to_load_is_not_served(failed_model, monkeypatch):
    pool = embedded.EmbeddedWorkers()
    assert asyncio.run(pool.still_served(failed_model)) is False
    assert asyncio.run(pool.still_served("never-started")) is True  # not started yet: the next request starts it
    alive = threading.Event()
    thread = threading.Thread(target=alive.wait)
    thread.start()
    try:
        monkeypatch.setitem(embedded._workers, "loading-model", (object(), thread))
        monkeypatch.setitem(embedded._load_failures, "loading-model", (time.monotonic(), "an older failure"))
        assert asyncio.run(pool.still_served("loading-model")) is True  # a new thread is loading it again
    finally:
        alive.set()
        thread.join()


def test_a_request_waiting_on_a_model_that_failed_to_load_ends_with_503(failed_model, monkeypatch):
    monkeypatch.setattr(job_run, "get_worker_pool", lambda: embedded.EmbeddedWorkers())
    monkeypatch.setattr(job_run, "LIVENESS_INTERVAL_S", 0.05)

    async def wait() -> JobRun:
        run = JobRun(reply=OneMailboxReply("reply.load-failure!"), request_id="r-broken", model=failed_model)
        run._next_liveness = 0.0
        cancelled = []
        run.cancel = lambda: cancelled.append(True) or setattr(run, "cancelled", True)  # no queue here
        with pytest.raises(ServiceUnavailable) as caught:
            async for _event in run.events(idle_s=0.05):
                pass
        assert cancelled == [True]
        return caught.value

    error = asyncio.run(asyncio.wait_for(wait(), timeout=10))
    assert error.status_code == 503 and error.code == "no_worker"
    assert error.headers.get("Retry-After") == "5" and failed_model in str(error)


# ---------------------------------------------------------------- a real load failure, through the engine thread
BROKEN = "broken-gguf"


@pytest.fixture
def broken_gguf(tmp_path):
    """A GGUF whose header and tokenizer read well (so the API tokenizes for it and queues its job) but whose
    tensor data is cut short: the engine fails while loading it, in the embedded thread's `_run`."""
    from tests.inference.gguf_helpers import tiny_base_gguf

    whole = tiny_base_gguf(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "broken.gguf"
    path.write_bytes(whole[: len(whole) // 2])
    return path


@pytest.fixture
def _engines_stopped():
    yield
    embedded.embedded_worker_stop()  # also forgets the load failure


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
async def test_a_model_that_fails_to_load_gets_503s_and_the_process_serves_the_others(
        asgi_client, make_key, broken_gguf, settings, monkeypatch, _engines_stopped):
    from asgiref.sync import sync_to_async

    from inference.engine.registry import SMOLLM2_NAME, unregister_model
    from inference.models import ServedModel

    settings.EMBEDDED_WORKER = True
    settings.SERVE_MODELS = [SMOLLM2_NAME, BROKEN]
    settings.ENGINE_KV_CACHE_MB, settings.ENGINE_MAX_NUM_SEQS = 32, 4
    settings.SSE_KEEPALIVE_S = 0.1  # the waiting request checks liveness after each idle tick
    monkeypatch.setattr(job_run, "LIVENESS_INTERVAL_S", 0.1)
    await sync_to_async(ServedModel.objects.create)(name=BROKEN, source=f"gguf:{broken_gguf}", context_length=256)
    key = await make_key()
    try:
        # the first request starts the engine thread and is queued; the load fails; the request ends with a 503
        response = await asyncio.wait_for(post(asgi_client, "/v1/completions", key, _body(BROKEN)), timeout=120)
        check(response, 503, param=None, code="no_worker", error_type="server_error")
        assert response.headers["retry-after"] == "5" and BROKEN in response.json()["error"]["message"]
        failure = embedded._load_failures[BROKEN][1]
        assert "reshape" in failure  # the engine's own error, recorded by `_run`
        # while LOAD_RETRY_S has not passed, the next request is refused at once, saying why
        response = await asyncio.wait_for(post(asgi_client, "/v1/completions", key, _body(BROKEN)), timeout=10)
        check(response, 503, param=None, code="model_unavailable", error_type="server_error")
        assert response.headers["retry-after"] == "5" and failure in response.json()["error"]["message"]
        # the same process serves its other model
        response = await asyncio.wait_for(post(asgi_client, "/v1/completions", key, _body(SMOLLM2_NAME)),
                                          timeout=300)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == SMOLLM2_NAME and response.json()["usage"]["completion_tokens"] == 2
    finally:
        unregister_model(BROKEN)


def _body(model: str) -> dict:
    return {"model": model, "prompt": "The capital of France is", "max_tokens": 2, "temperature": 0,
            "ignore_eos": True}
