"""Prefix-aware routing (inference.queue.routing), the same suite on the in-process and the Redis backend."""

from __future__ import annotations

import threading
import time

import pytest

from inference.queue.routing import RoutingPolicy, prefix_keys
from tests.inference.queue_helpers import make_job, queue_factory  # noqa: F401

SYSTEM_A = list(range(100, 164))  # 64 tokens: 4 routing blocks
SYSTEM_B = list(range(500, 564))
STEAL_S = 0.4


def routed(queue_factory, **policy):
    options = {"steal_after_s": STEAL_S, **policy}
    queue = queue_factory(heartbeat_timeout=5.0, routing=RoutingPolicy(**options))
    for worker in ("wa", "wb"):
        queue.heartbeat(worker, "m", {})
    return queue


def job_for(prompt: list[int], *, tenant_id: int = 1, salt: str | None = None, **fields):
    salt = salt if salt is not None else f"tenant:{tenant_id}"
    return make_job(tenant_id=tenant_id, prompt_token_ids=prompt, prefix_keys=prefix_keys(prompt, salt), **fields)


def report_room(queue, worker: str, room: int = 8, every: float = 0.0) -> None:
    """A worker's intake: what it could take now and, when busy, its seconds between intakes (nothing is
    queued for it, so nothing is leased)."""
    queue.take_cancellations_and_lease(worker, "m", room, intake_every_s=every)


def steal_wait(queue, worker: str, limit: float) -> tuple[list, float]:
    """`worker` waits as a worker loop does until it takes something (or `limit` passes): (jobs, seconds)."""
    started, taken = time.monotonic(), []
    while not taken and time.monotonic() - started < limit:
        queue.wait_for_work("m", timeout=1.0, worker_id=worker)
        taken = queue.lease(worker, "m", 1)
    return taken, time.monotonic() - started


def test_prefix_keys_are_chained_per_block_salted_and_shallowest_first():
    prompt = list(range(16 * 9 + 5))
    keys = prefix_keys(prompt, "tenant:1")
    assert len(keys) == 4  # 1, 2, 4 and 8 of the 9 full blocks
    assert all(len(key) == 16 and int(key, 16) >= 0 for key in keys)
    # a prefix of the prompt has the prefix of its keys; another tail changes none of them
    assert prefix_keys(prompt[:32], "tenant:1") == keys[:2]
    assert prefix_keys(prompt[:16 * 8] + [7] * 30, "tenant:1") == keys
    # another tenant's salt: not one key in common (no cross-tenant affinity signal)
    assert not set(prefix_keys(prompt, "tenant:2")) & set(keys)
    assert prefix_keys(list(range(15)), "tenant:1") == []  # under one block: nothing to route by


def test_a_worker_gets_back_the_prefix_it_served(queue_factory):
    queue = routed(queue_factory)
    first = job_for(SYSTEM_A + [1, 2])
    queue.enqueue(first)
    assert [job.request_id for job in queue.lease("wa", "m", 1)] == [first.request_id]
    report_room(queue, "wa")
    again = job_for(SYSTEM_A + [3, 4, 5])
    other = job_for(SYSTEM_B + [6], tenant_id=2)
    queue.enqueue(again)
    queue.enqueue(other)
    # wb asks first: it leaves wa's prefix to wa (which has room) and takes the job nobody holds
    assert [job.request_id for job in queue.lease("wb", "m", 2)] == [other.request_id]
    assert [job.request_id for job in queue.lease("wa", "m", 2)] == [again.request_id]


def test_the_tenant_salt_keeps_one_tenants_prefix_from_steering_another(queue_factory):
    queue = routed(queue_factory)
    queue.enqueue(job_for(SYSTEM_A, tenant_id=1))
    assert len(queue.lease("wa", "m", 1)) == 1
    report_room(queue, "wa")
    # the same system prompt sent by another tenant: no affinity to wa, wb takes it at once
    stranger = job_for(SYSTEM_A, tenant_id=2)
    queue.enqueue(stranger)
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [stranger.request_id]


def test_no_job_waits_on_its_preferred_worker_past_the_bound(queue_factory):
    queue = routed(queue_factory)
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa")  # wa has room but never comes for it
    waiting = job_for(SYSTEM_A + [9])
    queue.enqueue(waiting)
    assert queue.lease("wb", "m", 1) == []
    started = time.monotonic()
    taken = []
    while not taken and time.monotonic() - started < STEAL_S * 5:
        assert queue.wait_for_work("m", timeout=1.0, worker_id="wb") is True
        taken = queue.lease("wb", "m", 1)
    waited = time.monotonic() - started
    assert [job.request_id for job in taken] == [waiting.request_id]
    assert STEAL_S * 0.5 <= waited <= STEAL_S + 0.6, waited  # stolen once the bound passed, not before


def test_a_full_preferred_worker_has_its_jobs_taken_at_once(queue_factory):
    queue = routed(queue_factory)
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa", room=0)  # wa is full
    queued = job_for(SYSTEM_A + [9])
    queue.enqueue(queued)
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [queued.request_id]


def test_an_idle_worker_takes_work_from_a_preferred_worker_much_busier_than_it(queue_factory):
    queue = routed(queue_factory, steal_after_s=30.0, balance=2)
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa")
    queue.enqueue(job_for(SYSTEM_A + [1]))
    assert queue.lease("wb", "m", 1) == []  # wa holds one job more than wb: still wa's
    [second] = queue.lease("wa", "m", 1)
    report_room(queue, "wa")
    waiting = job_for(SYSTEM_A + [2])
    queue.enqueue(waiting)
    # wa holds two jobs and wb none: the imbalance reaches `balance`, wb does not stay idle
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [waiting.request_id]
    assert second.prefix_keys  # (the jobs did carry keys)


def test_a_job_waits_on_a_busy_preferred_worker_only_until_it_is_late(queue_factory):
    """Step-aware wait: the owner reported an intake every 50 ms; it is late after 2 x 50 + 10 ms, and the job
    is stolen then, not at the (long) bound."""
    queue = routed(queue_factory, steal_after_s=30.0)
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)  # wa holds this job: busy
    report_room(queue, "wa", every=0.05)
    waiting = job_for(SYSTEM_A + [9])
    queue.enqueue(waiting)
    assert queue.lease("wb", "m", 1) == []  # wa is expected back within 50 ms
    taken, waited = steal_wait(queue, "wb", limit=5.0)
    assert [job.request_id for job in taken] == [waiting.request_id]
    assert 0.03 <= waited <= 1.0, waited  # once wa was late (~0.11 s after its intake), far under 30 s


def test_a_busy_preferred_worker_back_in_time_keeps_its_job(queue_factory):
    queue = routed(queue_factory, steal_after_s=30.0)
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa", every=0.2)
    waiting = job_for(SYSTEM_A + [9])
    queue.enqueue(waiting)
    assert queue.lease("wb", "m", 1) == []
    assert [job.request_id for job in queue.lease("wa", "m", 1, intake_every_s=0.2)] == [waiting.request_id]


def test_a_job_does_not_wait_on_a_worker_not_back_before_its_bound(queue_factory):
    queue = routed(queue_factory)  # the bound: STEAL_S
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa", every=STEAL_S * 3)  # wa's steps are long: its next intake comes after the bound
    waiting = job_for(SYSTEM_A + [9])
    queue.enqueue(waiting)
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [waiting.request_id]


def test_an_idle_preferred_worker_is_waited_for_not_judged_late(queue_factory):
    """A worker holding nothing is woken when a job is left to it: however long ago its last intake, the job
    waits for it (up to the bound)."""
    queue = routed(queue_factory, steal_after_s=30.0)
    first = job_for(SYSTEM_A)
    queue.enqueue(first)
    queue.lease("wa", "m", 1)
    queue.complete("wa", first.request_id)  # wa holds nothing now
    report_room(queue, "wa", every=0.01)
    time.sleep(0.1)  # ten of its last intervals
    waiting = job_for(SYSTEM_A + [9])
    queue.enqueue(waiting)
    assert queue.lease("wb", "m", 1) == []
    assert [job.request_id for job in queue.lease("wa", "m", 1)] == [waiting.request_id]


def test_a_preferred_worker_that_dies_loses_nothing(queue_factory):
    queue = queue_factory(heartbeat_timeout=0.3, routing=RoutingPolicy(steal_after_s=30.0))
    queue.heartbeat("wa", "m", {})
    queue.heartbeat("wb", "m", {})
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa")
    orphan = job_for(SYSTEM_A + [1])
    queue.enqueue(orphan)
    assert queue.lease("wb", "m", 1) == []  # wa is alive and preferred (the steal bound is long here)
    time.sleep(0.4)  # wa stops heartbeating: dead
    queue.heartbeat("wb", "m", {})
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [orphan.request_id]
    assert queue.depth("m", "free") == 0
    # wb now holds the prefix: the next such job goes to it even with wa back
    queue.heartbeat("wa", "m", {})
    report_room(queue, "wb")
    follow = job_for(SYSTEM_A + [2])
    queue.enqueue(follow)
    assert queue.lease("wa", "m", 1) == []
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [follow.request_id]


def test_reaping_a_worker_drops_its_affinity(queue_factory):
    queue = routed(queue_factory, steal_after_s=30.0)
    queue.enqueue(job_for(SYSTEM_A))
    [job] = queue.lease("wa", "m", 1)
    queue.complete("wa", job.request_id)
    queue.unregister("wa")  # a clean exit
    queue.heartbeat("wa", "m", {})  # the same id comes back: it holds nothing any more
    report_room(queue, "wa")
    later = job_for(SYSTEM_A + [5])
    queue.enqueue(later)
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [later.request_id]


def test_routing_keeps_each_tenants_jobs_in_order(queue_factory):
    queue = routed(queue_factory)
    queue.enqueue(job_for(SYSTEM_A, tenant_id=1))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa")
    # tenant 1: a job for wa's prefix, then one with no affinity behind it
    head = job_for(SYSTEM_A + [1], tenant_id=1)
    behind = job_for(SYSTEM_B, tenant_id=1)
    queue.enqueue(head)
    queue.enqueue(behind)
    assert queue.lease("wb", "m", 2) == []  # the tenant's head waits for wa, and so does what is behind it
    assert [job.request_id for job in queue.lease("wa", "m", 2)] == [head.request_id, behind.request_id]


def test_with_routing_off_the_order_is_the_plain_one(queue_factory):
    queue = queue_factory(routing=RoutingPolicy.off())
    queue.heartbeat("wa", "m", {})
    queue.heartbeat("wb", "m", {})
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa")
    same = job_for(SYSTEM_A + [1])
    queue.enqueue(same)
    assert [job.request_id for job in queue.lease("wb", "m", 1)] == [same.request_id]


def test_a_worker_owns_at_most_its_cap_of_keys(queue_factory):
    queue = routed(queue_factory, steal_after_s=30.0, keys_per_worker=3)
    prompts = [list(range(1000 * i, 1000 * i + 16)) for i in range(1, 6)]  # one key each
    for prompt in prompts:
        queue.enqueue(job_for(prompt))
        [job] = queue.lease("wa", "m", 1)
        queue.complete("wa", job.request_id)
    report_room(queue, "wa")
    oldest, newest = job_for(prompts[0] + [1]), job_for(prompts[-1] + [1])
    queue.enqueue(oldest)
    queue.enqueue(newest)
    # wa forgot the two oldest prefixes: wb takes that job at once, the newest stays for wa
    assert [job.request_id for job in queue.lease("wb", "m", 2)] == [oldest.request_id]


def test_a_skipped_job_wakes_its_preferred_worker(queue_factory):
    queue = routed(queue_factory, steal_after_s=30.0)
    queue.enqueue(job_for(SYSTEM_A))
    queue.lease("wa", "m", 1)
    report_room(queue, "wa")
    woke = threading.Event()

    def wa_waits():
        queue.wait_for_work("m", timeout=5.0, worker_id="wa")
        woke.set()

    waiter = threading.Thread(target=wa_waits)
    waiter.start()
    time.sleep(0.2)
    job = job_for(SYSTEM_A + [7])
    queue.enqueue(job)
    if not woke.wait(0.2):  # wb took the enqueue's wake-up: its skipping wakes wa
        assert queue.lease("wb", "m", 1) == []
    assert woke.wait(2.0)
    waiter.join()
    assert [leased.request_id for leased in queue.lease("wa", "m", 1)] == [job.request_id]


@pytest.mark.parametrize("workers", [2, 3])
def test_no_request_starves_under_concurrent_workers(queue_factory, workers):
    """Workers leasing and completing concurrently: every job is taken exactly once, none waits past the
    steal bound plus a pull's slack while some worker has room."""
    queue = queue_factory(heartbeat_timeout=5.0, routing=RoutingPolicy(steal_after_s=0.2))
    names = [f"w{i}" for i in range(workers)]
    for name in names:
        queue.heartbeat(name, "m", {})
    jobs = [job_for([tenant * 1000 + t for t in range(32)] + [i], tenant_id=tenant)
            for i in range(30) for tenant in (1, 2, 3)]
    taken: dict[str, tuple[str, float]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def work(name: str) -> None:
        while not stop.is_set():
            for job in queue.lease(name, "m", 2):
                with lock:
                    assert job.request_id not in taken
                    taken[job.request_id] = (name, time.time() - job.enqueued_at)
                time.sleep(0.01)  # a step
                queue.complete(name, job.request_id)
            queue.wait_for_work("m", timeout=0.05, worker_id=name)

    threads = [threading.Thread(target=work, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for job in jobs:
        job.enqueued_at = time.time()
        queue.enqueue(job)
        time.sleep(0.003)
    deadline = time.monotonic() + 20
    while len(taken) < len(jobs) and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join()
    assert len(taken) == len(jobs)
    assert max(wait for _, wait in taken.values()) < 0.2 + 1.0
    assert len({name for name, _ in taken.values()}) >= 2  # the work spread
