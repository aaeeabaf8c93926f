"""The queue's autoscaling signals (oldest queued job, requests waiting for a worker), on both backends."""

from __future__ import annotations

import time

from tests.inference.queue_helpers import make_job, queue_factory  # noqa: F401


def test_oldest_queued_per_tier_follows_the_heads_of_every_tenant(queue_factory):
    queue = queue_factory()
    now = time.time()
    assert queue.oldest_queued("m") == {}
    queue.enqueue(make_job(tier="free", tenant_id=1, enqueued_at=now - 5))
    queue.enqueue(make_job(tier="free", tenant_id=2, enqueued_at=now - 30))
    queue.enqueue(make_job(tier="pro", tenant_id=1, enqueued_at=now - 2))
    oldest = queue.oldest_queued("m")
    assert set(oldest) == {"free", "pro"}
    assert abs(oldest["free"] - (now - 30)) < 1e-3 and abs(oldest["pro"] - (now - 2)) < 1e-3
    # the free tier's oldest leased (tenant 2 is not the ring's head: lease twice): the next oldest shows
    leased = queue.lease("w", "m", 3)
    assert len(leased) == 3 and queue.oldest_queued("m") == {}
    queue.enqueue(make_job(tier="free", tenant_id=3, enqueued_at=now - 1))
    assert abs(queue.oldest_queued("m")["free"] - (now - 1)) < 1e-3
    assert queue.oldest_queued("other") == {}


def test_demand_counts_waiting_requests_until_removed_or_lapsed(queue_factory):
    queue = queue_factory()
    now = time.time()
    queue.demand_add("m", "a", now + 30)
    queue.demand_add("m", "b", now + 0.2)
    queue.demand_add("n", "c", now + 30)
    assert queue.demand("m") == 2 and queue.demand("n") == 1 and queue.demand("x") == 0
    queue.demand_remove("m", "a")
    assert queue.demand("m") == 1
    time.sleep(0.3)  # "b" gave up (its process may have died without removing it)
    assert queue.demand("m") == 0
    queue.demand_remove("m", "never-added")
