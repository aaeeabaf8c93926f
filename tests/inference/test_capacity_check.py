"""The web side's "is a worker serving this model?" check (separate worker processes)."""

from __future__ import annotations

import asyncio

import pytest

from common.errors import ServiceUnavailable
from inference.api import services


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
    await services._capacity_check("m")  # nothing known: asked on the request path
    assert queue.asked == 1
    await services._capacity_check("m")  # younger than the re-check age: nothing asked
    assert queue.asked == 1
    await asyncio.sleep(0.12)
    queue.workers = []  # the last worker dies
    await services._capacity_check("m")  # older: answered from memory, one re-check started
    await services._capacity_check("m")
    recheck = services._live_rechecks["m"]
    await recheck
    assert queue.asked == 2
    with pytest.raises(ServiceUnavailable) as failure:  # the re-check's "no" applies to the next request
        await services._capacity_check("m")
    assert failure.value.code == "no_worker" and queue.asked == 3


async def test_without_any_worker_every_request_asks_and_gets_503(queue):
    queue.workers = []
    for expected in (1, 2):
        with pytest.raises(ServiceUnavailable):
            await services._capacity_check("m")
        assert queue.asked == expected
