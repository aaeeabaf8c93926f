"""A request waiting for a model whose embedded engine failed to load ends with a 503, never waits for ever
(issue 37: "never a request that waits forever").

The embedded pool says whether a model's queued jobs will still be served (`EmbeddedWorkers.still_served`):
not once its engine thread died at load. A waiting request's liveness check (`JobRun`, every
LIVENESS_INTERVAL_S while no event comes) asks the pool and ends the request with 503 `no_worker` and
Retry-After, cancelling its job."""

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
