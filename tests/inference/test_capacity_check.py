"""The web side's "is a worker serving this model?" check (separate worker processes)."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import ServiceUnavailable
from inference.api import capacity as services


class FakeQueue:
    def __init__(self) -> None:
        self.workers = [{"worker_id": "w1"}]
        self.asked = 0

    def live_workers(self, model):
        self.asked += 1
        return list(self.workers)


@pytest.fixture
def queue(monkeypatch, settings):
    settings.EMBEDDED_WORKER = False
    settings.MODEL_WAIT_S = 0  # ask once, no wait (the bounded wait: test_a_missing_worker_is_waited_for)
    fake = FakeQueue()
    monkeypatch.setattr("inference.queue.get_job_queue", lambda: fake)
    monkeypatch.setattr(services, "LIVE_WORKERS_TTL_S", 0.2)
    monkeypatch.setattr(services, "LIVE_WORKERS_RECHECK_S", 0.1)
    services._live_workers.clear()
    services._live_rechecks.clear()
    yield fake
    services._live_workers.clear()
    services._live_rechecks.clear()


async def test_a_yes_is_trusted_then_rechecked_off_the_request_path(queue):
    await services.capacity_check("m")  # nothing known: asked on the request path
    assert queue.asked == 1
    await services.capacity_check("m")  # younger than the re-check age: nothing asked
    assert queue.asked == 1
    await asyncio.sleep(0.12)
    queue.workers = []  # the last worker dies
    await services.capacity_check("m")  # older: answered from memory, one re-check started
    await services.capacity_check("m")
    recheck = services._live_rechecks["m"]
    await recheck
    assert queue.asked == 2
    with pytest.raises(ServiceUnavailable) as failure:  # the re-check's "no" applies to the next request
        await services.capacity_check("m")
    assert failure.value.code == "model_unavailable" and queue.asked == 3


async def test_without_any_worker_every_request_asks_and_gets_503(queue):
    queue.workers = []
    for expected in (1, 2):
        with pytest.raises(ServiceUnavailable):
            await services.capacity_check("m")
        assert queue.asked == expected


async def test_a_missing_worker_is_waited_for_a_bounded_time(queue, settings, monkeypatch):
    monkeypatch.setattr(services, "WAIT_POLL_S", 0.05)
    settings.MODEL_WAIT_S = 0.3
    queue.workers = []
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ServiceUnavailable) as failure:
        await services.capacity_check("m")
    assert 0.3 <= loop.time() - started < 2 and queue.asked >= 3
    assert failure.value.code == "model_unavailable" and failure.value.headers["Retry-After"] == "5"
    asked = queue.asked

    async def worker_comes_up():
        await asyncio.sleep(0.1)
        queue.workers = [{"worker_id": "w2"}]

    settings.MODEL_WAIT_S = 5
    arrival = asyncio.ensure_future(worker_comes_up())
    started = loop.time()
    await services.capacity_check("m")  # the worker came up within the wait: served
    await arrival
    assert loop.time() - started < 1 and queue.asked > asked


async def test_requests_waiting_for_one_model_share_a_poll_and_go_on_in_their_order(queue, settings, monkeypatch):
    """capacity_ready never waits; capacity_wait does, out of the caller's line (the WebSocket's admission). The
    waiters of one model share one read of the heartbeats per WAIT_POLL_S, each bounded by its own MODEL_WAIT_S,
    and a worker seen answers them in the order they began to wait."""
    monkeypatch.setattr(services, "WAIT_POLL_S", 0.05)
    settings.MODEL_WAIT_S = 5
    queue.workers = []
    assert await services.capacity_ready("m") is False and queue.asked == 1
    order: list[str] = []

    async def waiter(name: str) -> None:
        await services.capacity_wait("m")
        order.append(name)

    tasks = [asyncio.ensure_future(waiter(name)) for name in ("a", "b", "c")]
    await asyncio.sleep(0.22)
    asked = queue.asked - 1
    assert 1 <= asked <= 6  # one poll for the three (three polls would ask three times as often)
    queue.workers = [{"worker_id": "w1"}]
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=2)
    assert order == ["a", "b", "c"] and not services._waiting.get(asyncio.get_running_loop())
    settings.MODEL_WAIT_S = 0.1  # a short wait ends on its own deadline while a longer one goes on
    queue.workers = []
    services._live_workers.clear()
    short = asyncio.ensure_future(services.capacity_wait("m"))
    await asyncio.sleep(0)  # it has read its MODEL_WAIT_S
    settings.MODEL_WAIT_S = 5
    long = asyncio.ensure_future(services.capacity_wait("m"))
    with pytest.raises(ServiceUnavailable):
        await asyncio.wait_for(short, timeout=2)
    assert not long.done()
    queue.workers = [{"worker_id": "w2"}]
    await asyncio.wait_for(long, timeout=2)


async def test_a_request_waiting_for_a_worker_counts_as_demand_until_one_comes(queue, settings, monkeypatch):
    """llmp:requests_waiting_for_worker, what scales a model up from zero replicas, counts the waiting request
    on the queue (every web replica sees it) and forgets it once a worker serves the model."""
    from inference.queue.memory import MemoryJobQueue

    real = MemoryJobQueue()
    queue.demand_add, queue.demand_remove, queue.demand = real.demand_add, real.demand_remove, real.demand
    monkeypatch.setattr(services, "WAIT_POLL_S", 0.05)
    settings.MODEL_WAIT_S = 5
    queue.workers = []
    waiting = asyncio.ensure_future(services.capacity_check("m"))
    for _ in range(100):
        await asyncio.sleep(0.02)
        if real.demand("m"):
            break
    assert real.demand("m") == 1 and real.demand("other") == 0
    queue.workers = [{"worker_id": "w1"}]
    await waiting
    for _ in range(50):  # removed off the request path
        await asyncio.sleep(0.02)
        if not real.demand("m"):
            break
    assert real.demand("m") == 0
