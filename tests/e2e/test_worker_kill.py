"""Two real `run_worker` processes on Redis + PostgreSQL: SIGKILL one while it holds jobs, SIGTERM drains.

The test plays the web process: it enqueues Jobs on the Redis queue and reads
the events from the Redis channel layer, as the API does.
- Worker A takes four jobs (two long ones run, two wait unstarted in its engine);
  then worker B starts, and A is killed with SIGKILL. B reaps A: the two
  unstarted jobs are requeued and B serves them to the end; the two started
  ones end with an error event. Each request has exactly one usage record.
- Every job holds a concurrency slot (billing.counters, as the web admits it):
  after the kill, the reaper's error records and B's finished ones give all of
  them back.
- B gets SIGTERM while it streams a job: it finishes that job, takes no new
  one, unregisters and exits 0.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import threading
import time
import uuid

import pytest

from billing.counters.base import Plan, Slot
from billing.counters.keys import CounterKey, reservation_key
from tenants.services.limits import LimitScope
from tests.e2e.processes import (
    MODEL, Proc, database_prepare, postgres_database_reset, process_env, usage_records, wait_until, worker_start,
)
from tests.inference.queue_helpers import events_unpack, make_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REDIS_URL = os.environ.get("QUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
DATABASE_URL = os.environ.get("QUEUE_E2E_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_queue")
HEARTBEAT_TIMEOUT_S = 3.0


def _servers_up() -> str | None:
    import psycopg
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        return f"Redis: {exc}"
    try:
        psycopg.connect(DATABASE_URL.rsplit("/", 1)[0] + "/postgres", connect_timeout=3).close()
    except psycopg.Error as exc:
        return f"PostgreSQL: {exc}"
    return None


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    problem = _servers_up()
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"e2e worker test needs Redis and PostgreSQL under CI: {problem}")
        pytest.skip(problem)
    import psycopg

    from billing.counters.redis_backend import RedisAdmission
    from inference.queue.redis_backend import RedisJobQueue

    tmp = tmp_path_factory.mktemp("worker_kill")
    prefix = f"e2e-{uuid.uuid4().hex[:8]}"
    postgres_database_reset(DATABASE_URL)
    env = process_env(DATABASE_URL=DATABASE_URL, REDIS_URL=REDIS_URL, QUEUE_KEY_PREFIX=prefix,
                      ADMISSION_KEY_PREFIX=f"{prefix}-lim",
                      WORKER_HEARTBEAT_TIMEOUT_S=str(HEARTBEAT_TIMEOUT_S), OMP_NUM_THREADS="1", LOG_LEVEL="INFO")
    database_prepare(env)
    with psycopg.connect(DATABASE_URL) as conn:
        tenant_id, tier = conn.execute(
            "SELECT t.id, r.name FROM tenants_tenant t JOIN tenants_tier r ON r.id = t.tier_id WHERE t.slug = 'demo'"
        ).fetchone()
    queue = RedisJobQueue(url=REDIS_URL, prefix=prefix, heartbeat_timeout=HEARTBEAT_TIMEOUT_S)
    admission = RedisAdmission(url=REDIS_URL, prefix=f"{prefix}-lim")
    procs: list[Proc] = []
    yield {"env": env, "tmp": tmp, "queue": queue, "tenant_id": tenant_id, "tier": tier, "procs": procs,
           "admission": admission}
    for proc in procs:
        proc.stop(timeout=20)
    queue.flush()
    admission.flush()


def start_worker(stack, name: str) -> Proc:
    proc = worker_start(stack["env"], stack["tmp"], name=name,
                        extra=("--worker-id", name, "--max-num-seqs", "2", "--kv-cache-mb", "64"))
    stack["procs"].append(proc)

    def serving():
        assert proc.alive, f"{name} died:\n{proc.log_tail()}"
        return any(w["worker_id"] == name and w.get("status") == "serving" for w in stack["queue"].live_workers(MODEL))

    wait_until(serving, timeout=180, what=f"{name} to serve")
    return proc


def job_for(stack, channel: str, *, max_tokens: int):
    return make_job(model=MODEL, tenant_id=stack["tenant_id"], tier=stack["tier"], priority=2,
                    prompt_token_ids=[1, 504, 3458, 282, 253, 1345, 2],
                    sampling={"max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True},
                    reply_channel=channel, request_id=f"e2e-{uuid.uuid4().hex[:16]}")


class Events:
    """Reply channels on the Redis channel layer, as the web process would hold them (with their
    liveness keys refreshed, as inference.api.replies does: a worker aborts the jobs of a silent channel)."""

    def __init__(self, queue) -> None:
        from channels_redis.core import RedisChannelLayer

        # as settings.CHANNEL_LAYERS: a socket timeout longer than the 5 s blocking pop
        self.layer = RedisChannelLayer(hosts=[{"address": REDIS_URL, "socket_timeout": 30}], capacity=10000, expiry=120)
        self.buffers: dict[str, collections.deque] = {}
        self.queue = queue
        # a thread: the test blocks its event loop while a worker loads
        threading.Thread(target=self._keep_alive, name="reply-alive", daemon=True).start()

    async def channel(self) -> str:
        name = await self.layer.new_channel("reply.")
        self.buffers.setdefault(name, collections.deque())
        self.queue.reply_channels_touch([name], 3.0)
        return name

    def _keep_alive(self) -> None:
        while True:
            time.sleep(1.0)
            self.queue.reply_channels_touch(list(self.buffers), 3.0)

    async def receive(self, channel: str, timeout: float = 60.0) -> dict:
        """The next event on `channel` (wire form); the workers send them in batches."""
        buffer = self.buffers.setdefault(channel, collections.deque())
        while not buffer:
            message = await asyncio.wait_for(self.layer.receive(channel), timeout)
            buffer.extend(events_unpack(message))
        return buffer.popleft()

    async def until_done(self, channel: str, timeout: float = 120.0) -> tuple[list[dict], dict]:
        deltas = []
        while True:
            event = await self.receive(channel, timeout)
            if event["type"] == "engine.done":
                return deltas, event
            deltas.append(event)


async def test_sigkill_requeues_unstarted_fails_started_and_sigterm_drains(stack):
    queue = stack["queue"]
    events = Events(queue)
    worker_a = start_worker(stack, "worker-a")

    # Two long jobs run on A (max_num_seqs 2); two short ones wait behind them in
    # A's engine, leased but unstarted, while B loads.
    jobs = [job_for(stack, await events.channel(), max_tokens=n) for n in (1000, 1000, 48, 48)]
    admission = stack["admission"]
    slot = Slot(admission.key(CounterKey.concurrency(LimitScope.tenant(stack['tenant_id']))), 4)
    for job in jobs:  # admitted as the web admits them: one slot each, settled when the request ends
        assert admission.admit(Plan(request_id=job.request_id, slots=(slot,))).admitted
        job.reservation_id = job.request_id
        queue.enqueue(job)
    assert admission.admit(Plan(request_id="a-fifth", slots=(slot,))).refusal.kind == "concurrency"
    first = {job.request_id: await events.receive(job.reply_channel) for job in jobs[:2]}
    assert all(event["type"] == "engine.delta" for event in first.values())
    leases = wait_until(lambda: (l := queue.leases("worker-a")) and len(l) == 4 and l, timeout=10, what="4 leases")
    started = {rid for rid, flag in leases.items() if flag}
    assert started == {jobs[0].request_id, jobs[1].request_id}, leases

    worker_b = start_worker(stack, "worker-b")
    assert queue.leases("worker-b") == {}  # nothing was left on the queue for it
    assert set(queue.leases("worker-a")) == {job.request_id for job in jobs}, "A must still hold its jobs"
    worker_a.signal(signal.SIGKILL)
    worker_a.popen.wait(10)
    killed_at = time.monotonic()

    for job in jobs[:2]:  # started on A: an error event, one usage record with finish_reason error
        _deltas, done = await events.until_done(job.reply_channel)
        assert done["finish_reason"] == "error" and done["error"], done
    assert time.monotonic() - killed_at < HEARTBEAT_TIMEOUT_S + 10
    for job in jobs[2:]:  # requeued at the front and served whole by B
        deltas, done = await events.until_done(job.reply_channel)
        assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 48
        assert sum(len(d["token_ids"]) for d in deltas) == 48
    for job in jobs:
        rows = usage_records(DATABASE_URL, job.request_id)
        assert len(rows) == 1, rows
        expected = "error" if job in jobs[:2] else "length"
        assert rows[0]["finish_reason"] == expected
    assert {w["worker_id"] for w in queue.live_workers(MODEL)} == {"worker-b"}
    assert queue.leases("worker-a") == {}
    assert admission.redis.zcard(slot.key) == 0  # the reaped and the requeued requests gave their slots back
    assert admission.stale_reservations() == []
    assert not admission.redis.exists(reservation_key(admission.prefix, jobs[0].request_id))

    # SIGTERM: B finishes the job it streams, leaves the next one queued, exits 0.
    running = job_for(stack, await events.channel(), max_tokens=40)
    queue.enqueue(running)
    assert (await events.receive(running.reply_channel))["type"] == "engine.delta"
    worker_b.signal(signal.SIGTERM)
    await asyncio.sleep(0.3)
    later = job_for(stack, await events.channel(), max_tokens=4)
    queue.enqueue(later)
    deltas, done = await events.until_done(running.reply_channel)
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 40
    assert worker_b.popen.wait(60) == 0, worker_b.log_tail()
    assert queue.depth(MODEL, stack["tier"]) == 1 and queue.live_workers(MODEL) == []
    assert usage_records(DATABASE_URL, later.request_id) == []
    assert len(usage_records(DATABASE_URL, running.request_id)) == 1
