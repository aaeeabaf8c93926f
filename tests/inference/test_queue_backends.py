"""JobQueue semantics, the same suite on the in-process and the Redis backend."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter

import pytest

from inference.queue import QueueFull, ReplyLiveness, WorkerRegistry
from inference.queue.job import Job
from inference.queue.redis_backend import RedisJobQueue
from tests.inference.queue_helpers import REDIS_TEST_URL, make_job, queue_factory, require_redis  # noqa: F401

WEIGHTS = {"enterprise": 8, "pro": 4, "free": 1}


@contextlib.contextmanager
def redis_commands(queue: RedisJobQueue):
    """The names of the commands `queue` sends to Redis inside the block (they still run)."""
    commands: list[str] = []
    execute = queue.redis.execute_command

    def counting(*args, **options):
        commands.append(str(args[0]).upper())
        return execute(*args, **options)

    queue.redis.execute_command = counting
    try:
        yield commands
    finally:
        queue.redis.execute_command = execute


def lease_one_by_one(queue, n: int, worker: str = "w1", model: str = "m") -> list[Job]:
    out = []
    for _ in range(n):
        jobs = queue.lease(worker, model, 1)
        if not jobs:
            break
        out.extend(jobs)
    return out


def test_job_json_round_trip():
    job = make_job(tier="pro", tenant_id=7, api_key_id=3, reservation_id="res-1", cache_salt="tenant:7",
                   endpoint="completions", tenant_slug="acme", sampling={"max_tokens": 9, "stop": ["\n"], "seed": 1})
    again = Job.from_json(job.to_json())
    assert again == job
    assert Job.from_dict({**job.to_dict(), "added_later": 1}) == job  # unknown keys are ignored


def test_job_rejects_tabs_in_names():
    with pytest.raises(ValueError):
        make_job(tier="fr\tee")


def test_fifo_lease_complete_and_depth(queue_factory):
    queue = queue_factory()
    jobs = [make_job() for _ in range(3)]
    for job in jobs:
        queue.enqueue(job)
    assert queue.depth("m", "free") == 3
    assert queue.depth("m", "pro") == 0
    assert queue.depth("other", "free") == 0
    leased = queue.lease("w1", "m", 2)
    assert [j.request_id for j in leased] == [j.request_id for j in jobs[:2]]
    assert leased[0] == jobs[0]  # the whole job comes back intact
    assert queue.depth("m", "free") == 1
    assert queue.leases("w1") == {jobs[0].request_id: False, jobs[1].request_id: False}
    assert queue.mark_started("w1", [jobs[0].request_id]) == {jobs[0].request_id}
    assert queue.leases("w1")[jobs[0].request_id] is True
    assert queue.complete("w1", jobs[0].request_id) is True
    assert queue.complete("w1", jobs[0].request_id) is False  # only once
    assert queue.complete("w2", jobs[1].request_id) is False  # not w2's lease
    assert list(queue.leases("w1")) == [jobs[1].request_id]
    assert [j.request_id for j in queue.lease("w1", "m", 5)] == [jobs[2].request_id]
    assert queue.lease("w1", "m", 5) == []
    assert queue.depths("m") == {}


def test_duplicate_request_id_is_refused(queue_factory):
    queue = queue_factory()
    queue.enqueue(make_job(request_id="dup"))
    with pytest.raises(ValueError):
        queue.enqueue(make_job(request_id="dup"))
    queue.lease("w1", "m", 1)
    with pytest.raises(ValueError):  # still leased: still known
        queue.enqueue(make_job(request_id="dup"))


def test_bounded_queue_raises_queue_full(queue_factory):
    queue = queue_factory(max_depth=2)
    queue.enqueue(make_job())
    queue.enqueue(make_job())
    with pytest.raises(QueueFull) as info:
        queue.enqueue(make_job())
    assert info.value.status_code == 503
    queue.enqueue(make_job(tier="pro"))  # the bound is per (model, tier)
    assert len(queue.lease("w1", "m", 3)) == 3
    queue.enqueue(make_job())  # room again


async def test_aenqueue_is_enqueue_on_the_event_loop(queue_factory):
    """The web side's enqueue: same queue state, same refusals (Redis: through an asyncio client)."""
    queue = queue_factory(max_depth=2)
    first = make_job(request_id="a-1")
    await queue.aenqueue(first)
    with pytest.raises(ValueError):
        await queue.aenqueue(make_job(request_id="a-1"))
    await queue.aenqueue(make_job(request_id="a-2"))
    with pytest.raises(QueueFull):
        await queue.aenqueue(make_job(request_id="a-3"))
    assert queue.depths("m") == {first.tier: 2}
    assert [j.request_id for j in queue.lease("w1", "m", 5)] == ["a-1", "a-2"]


def test_round_robin_across_tenants_in_a_tier(queue_factory):
    queue = queue_factory()
    for _ in range(6):
        queue.enqueue(make_job(tenant_id=1))  # tenant 1 floods first
    for tenant in (2, 3):
        for _ in range(2):
            queue.enqueue(make_job(tenant_id=tenant))
    order = [job.tenant_id for job in lease_one_by_one(queue, 10)]
    assert order == [1, 2, 3, 1, 2, 3, 1, 1, 1, 1]
    # A batch lease follows the same rotation.
    for tenant in (1, 1, 1, 2, 3):
        queue.enqueue(make_job(tenant_id=tenant))
    assert [job.tenant_id for job in queue.lease("w1", "m", 5)] == [1, 2, 3, 1, 1]


def test_tiers_are_served_in_proportion_to_their_weights(queue_factory):
    queue = queue_factory(weights=WEIGHTS)
    for tier in ("free", "pro", "enterprise"):
        for _ in range(40):
            queue.enqueue(make_job(tier=tier))
    served = Counter(job.tier for job in lease_one_by_one(queue, 26))
    assert served == {"enterprise": 16, "pro": 8, "free": 2}
    served = Counter(job.tier for job in queue.lease("w1", "m", 13))  # batches too
    assert served == {"enterprise": 8, "pro": 4, "free": 1}


def test_heavier_tier_queued_later_goes_first_and_lighter_is_not_starved(queue_factory):
    queue = queue_factory(weights=WEIGHTS)
    for _ in range(5):
        queue.enqueue(make_job(tier="free"))
    for _ in range(20):
        queue.enqueue(make_job(tier="enterprise"))
    tiers = [job.tier for job in lease_one_by_one(queue, 18)]
    assert tiers[:4] == ["enterprise"] * 4
    assert tiers.count("free") == 2  # 1 in 9 pulls while enterprise keeps coming


def test_weights_from_a_callable_and_unknown_tiers(queue_factory):
    weights = {"gold": 3}
    queue = queue_factory(weights=lambda: weights)
    for tier in ("gold", "mystery"):
        for _ in range(10):
            queue.enqueue(make_job(tier=tier))
    served = Counter(job.tier for job in lease_one_by_one(queue, 8))
    assert served == {"gold": 6, "mystery": 2}  # unknown tiers weigh 1


def test_models_are_separate_queues(queue_factory):
    queue = queue_factory()
    queue.enqueue(make_job(model="a"))
    queue.enqueue(make_job(model="b:with:colons"))
    assert queue.lease("w1", "b:with:colons", 5)[0].model == "b:with:colons"
    assert queue.depths("a") == {"free": 1}
    assert queue.lease("w1", "b:with:colons", 5) == []


def test_cancel_queued_leased_and_unknown(queue_factory):
    queue = queue_factory()
    first, second, third = make_job(tenant_id=1), make_job(tenant_id=1), make_job(tenant_id=2)
    for job in (first, second, third):
        queue.enqueue(job)
    assert queue.cancel(second.request_id) == "dropped"
    assert queue.depth("m", "free") == 2
    assert [j.request_id for j in queue.take_dropped("m")] == [second.request_id]
    assert queue.take_dropped("m") == []
    leased = queue.lease("w1", "m", 5)
    assert [j.request_id for j in leased] == [first.request_id, third.request_id]
    assert queue.cancel(first.request_id) == "signalled"
    assert queue.take_cancellations("w1") == {first.request_id}
    assert queue.take_cancellations("w1") == set()
    assert queue.complete("w1", first.request_id)
    assert queue.cancel(first.request_id) == "unknown"
    assert queue.cancel("never-seen") == "unknown"


def test_cancellations_and_leases_in_one_call(queue_factory):
    queue = queue_factory(weights=WEIGHTS)
    first = make_job(tier="free")
    queue.enqueue(first)
    assert queue.take_cancellations_and_lease("w1", "m", 4) == (set(), [first])
    assert queue.cancel(first.request_id) == "signalled"
    later = [make_job(tier="free"), make_job(tier="enterprise"), make_job(tier="pro")]
    for job in later:
        queue.enqueue(job)
    cancelled, jobs = queue.take_cancellations_and_lease("w1", "m", 2)
    assert cancelled == {first.request_id}
    assert [j.tier for j in jobs] == ["enterprise", "pro"]  # the same policy as lease()
    assert queue.depth("m", "free") == 1
    assert queue.take_cancellations_and_lease("w1", "m", 0) == (set(), [])  # no room: cancellations only
    assert queue.depth("m", "free") == 1
    assert queue.take_cancellations_and_lease("w1", "other", 5) == (set(), [])
    assert [j.request_id for j in queue.take_cancellations_and_lease("w1", "m", 5)[1]] == [later[0].request_id]


def test_on_redis_a_worker_with_nothing_queued_asks_once_per_step():
    require_redis()
    queue = RedisJobQueue(url=REDIS_TEST_URL, prefix=f"test:{uuid.uuid4().hex}")
    queue.enqueue(make_job())
    queue.take_cancellations_and_lease("w0", "m", 1)  # both scripts in Redis's cache, as in a running worker
    with redis_commands(queue) as commands:
        assert queue.take_cancellations_and_lease("w1", "m", 8) == (set(), [])
    assert commands == ["EVALSHA"]
    queue.enqueue(make_job())
    with redis_commands(queue) as commands:
        assert len(queue.take_cancellations_and_lease("w1", "m", 8)[1]) == 1
    assert commands == ["EVALSHA", "EVALSHA"]  # the lease itself, when something is queued
    queue.flush()


def test_complete_many_releases_what_the_worker_still_holds(queue_factory):
    queue = queue_factory()
    jobs = [make_job() for _ in range(4)]
    for job in jobs:
        queue.enqueue(job)
    leased = [j.request_id for j in queue.lease("w1", "m", 3)]
    other = queue.lease("w2", "m", 1)[0].request_id
    queue.cancel(leased[1])  # a cancellation pending for a lease is cleared with it
    assert queue.complete("w1", leased[0])
    assert queue.complete_many("w1", [leased[0], leased[1], leased[2], other, "unknown"]) == {leased[1], leased[2]}
    assert queue.leases("w1") == {}
    assert queue.take_cancellations("w1") == set()
    assert queue.leases("w2") == {other: False}  # another worker's lease is not touched
    assert queue.complete_many("w1", []) == set()
    assert queue.complete_many("w2", [other]) == {other}


def test_on_redis_complete_many_is_one_round_trip():
    require_redis()
    queue = RedisJobQueue(url=REDIS_TEST_URL, prefix=f"test:{uuid.uuid4().hex}")
    for _ in range(6):
        queue.enqueue(make_job())
    ids = [j.request_id for j in queue.lease("w1", "m", 6)]
    queue.complete("w1", ids.pop())  # the script in Redis's cache, as in a running worker
    with redis_commands(queue) as commands:
        assert queue.complete_many("w1", ids) == set(ids)
    assert commands == ["EVALSHA"]
    assert queue.leases("w1") == {}
    queue.flush()


def test_cancelling_the_last_job_of_a_tenant_keeps_the_rotation_intact(queue_factory):
    queue = queue_factory()
    a1, b1, c1, a2 = make_job(tenant_id=1), make_job(tenant_id=2), make_job(tenant_id=3), make_job(tenant_id=1)
    for job in (a1, b1, c1, a2):
        queue.enqueue(job)
    queue.cancel(b1.request_id)
    assert [j.request_id for j in lease_one_by_one(queue, 5)] == [a1.request_id, c1.request_id, a2.request_id]


def test_heartbeats_and_live_workers(queue_factory):
    queue = queue_factory(heartbeat_timeout=0.4)
    assert queue.live_workers("m") == []
    assert queue.heartbeat("w1", "m", {"device": "cpu", "running": 2, "waiting": 0, "kv_usage": 0.1, "tok_s": 5.0})
    assert queue.heartbeat("w2", "other", {"device": "cuda:0"})
    live = queue.live_workers("m")
    assert [w["worker_id"] for w in live] == ["w1"]
    assert live[0]["running"] == 2 and live[0]["device"] == "cpu" and live[0]["model"] == "m"
    assert {w["worker_id"] for w in queue.live_workers()} == {"w1", "w2"}
    time.sleep(0.5)
    assert queue.live_workers("m") == []


def test_reaping_a_dead_worker(queue_factory):
    queue = queue_factory(heartbeat_timeout=0.3)
    jobs = [make_job(tenant_id=1) for _ in range(3)]
    for job in jobs:
        queue.enqueue(job)
    queue.heartbeat("dead", "m", {})
    queue.heartbeat("alive", "m", {})
    leased = queue.lease("dead", "m", 3)
    assert len(leased) == 3
    queue.mark_started("dead", [jobs[1].request_id])
    later = make_job(tenant_id=1)
    queue.enqueue(later)
    assert queue.reap_dead_workers().dead_workers == []  # heartbeats still fresh
    time.sleep(0.4)
    queue.heartbeat("alive", "m", {})
    result = queue.reap_dead_workers()
    assert result.dead_workers == ["dead"]
    assert sorted(result.requeued) == sorted([jobs[0].request_id, jobs[2].request_id])
    assert [(w, j.request_id) for w, j in result.failed] == [("dead", jobs[1].request_id)]
    assert result.failed[0][1] == jobs[1]
    # Requeued at the front, oldest first, ahead of the job queued meanwhile.
    assert queue.depth("m", "free") == 3
    order = [j.request_id for j in lease_one_by_one(queue, 3, worker="alive")]
    assert order == [jobs[0].request_id, jobs[2].request_id, later.request_id]
    # Exactly once: a second pass finds nothing.
    again = queue.reap_dead_workers()
    assert again.dead_workers == [] and again.failed == [] and again.requeued == []


def test_a_reaped_worker_that_was_only_slow_learns_it(queue_factory):
    queue = queue_factory(heartbeat_timeout=0.2)
    job = make_job()
    queue.enqueue(job)
    queue.heartbeat("slow", "m", {})
    queue.lease("slow", "m", 1)
    time.sleep(0.3)
    queue.reap_dead_workers()
    assert queue.mark_started("slow", [job.request_id]) == set()
    assert queue.complete("slow", job.request_id) is False
    queue.enqueue(make_job())
    assert queue.lease("slow", "m", 5) == []  # no new work until it has heard
    assert queue.heartbeat("slow", "m", {}) is False
    assert queue.heartbeat("slow", "m", {}) is True
    assert len(queue.lease("slow", "m", 5)) == 2  # the requeued job and the new one


def test_unregister_requeues_unstarted_and_returns_started(queue_factory):
    queue = queue_factory()
    a, b = make_job(), make_job()
    queue.enqueue(a)
    queue.enqueue(b)
    queue.heartbeat("w1", "m", {})
    queue.lease("w1", "m", 2)
    queue.mark_started("w1", [b.request_id])
    result = queue.unregister("w1")
    assert result.requeued == [a.request_id]
    assert [j.request_id for _, j in result.failed] == [b.request_id]
    assert queue.live_workers("m") == []
    assert queue.heartbeat("w1", "m", {}) is True  # a clean exit is not a reap


def test_the_worker_registry_and_reply_liveness_are_small_interfaces_of_their_own(queue_factory):
    """A queue is made of a WorkerRegistry (`workers`) and a ReplyLiveness (`replies`); its own methods
    of those names and the parts answer alike."""
    queue = queue_factory(heartbeat_timeout=5.0)
    assert isinstance(queue, WorkerRegistry) and isinstance(queue, ReplyLiveness)
    assert isinstance(queue.workers, WorkerRegistry) and isinstance(queue.replies, ReplyLiveness)
    assert queue.workers.heartbeat_timeout == queue.heartbeat_timeout == 5.0
    assert queue.workers.heartbeat("w1", "m", {})
    assert [w["worker_id"] for w in queue.live_workers("m")] == ["w1"]
    assert queue.workers.unregister("w1").dead_workers == [] and queue.live_workers("m") == []
    queue.reply_channels_touch(["a", "b"], 5.0)
    alive = queue.reply_channels_alive({"a", "b", "c"})
    assert alive == queue.replies.reply_channels_alive({"a", "b", "c"})
    assert alive == ({"a", "b"} if queue.remote else {"a", "b", "c"})  # in-process: every channel is read
    assert queue.reply_channels_alive(set()) == set()


def test_wait_for_work_wakes_on_enqueue(queue_factory):
    queue = queue_factory()
    assert queue.wait_for_work("m", timeout=0.05) is False
    timer = threading.Timer(0.1, lambda: queue.enqueue(make_job()))
    timer.start()
    start = time.monotonic()
    assert queue.wait_for_work("m", timeout=3.0) is True
    assert time.monotonic() - start < 2.0
    timer.join()


def test_concurrent_workers_lease_each_job_once(queue_factory):
    queue = queue_factory()
    jobs = [make_job(tenant_id=i % 5, tier=("free", "pro")[i % 2]) for i in range(200)]
    for job in jobs:
        queue.enqueue(job)
    taken: list[str] = []
    lock = threading.Lock()

    def work(worker: str) -> None:
        while True:
            got = queue.lease(worker, "m", 3)
            if not got:
                return
            with lock:
                taken.extend(j.request_id for j in got)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == sorted(j.request_id for j in jobs)
    assert queue.depths("m") == {}
