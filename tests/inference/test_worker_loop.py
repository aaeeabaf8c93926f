"""The worker loop on the real engine and model (SmolLM2), in-process queue and channel layer.

One engine is loaded for the module; each test runs a WorkerLoop on it in a
thread and reads the events from an InMemoryChannelLayer served by its own
event loop (as the web server's would be in the embedded mode).
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
import uuid

import pytest
from channels.layers import InMemoryChannelLayer

from inference.protocol import Delta
from inference.queue.memory import MemoryJobQueue
from inference.worker.events import EventSink
from inference.worker.loop import WorkerLoop
from billing.models import UsageRecord
from tests.inference.queue_helpers import events_unpack, make_job

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MODEL = "smollm2-135m-instruct"
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def engine():
    from inference.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=MODEL, device="cpu", dtype="bfloat16", kv_cache_mb=64, max_num_seqs=8,
                               max_num_batched_tokens=512))


class Harness:
    """A running WorkerLoop plus a way to read its events."""

    def __init__(self, engine, *, heartbeat_timeout: float = 5.0, **loop_options) -> None:
        self.engine = engine
        self.queue = MemoryJobQueue(weights={"enterprise": 8, "pro": 4, "free": 1}, heartbeat_timeout=heartbeat_timeout)
        self.layer = InMemoryChannelLayer()
        self.aloop = asyncio.new_event_loop()
        self.aloop_thread = threading.Thread(target=self.aloop.run_forever, daemon=True)
        self.aloop_thread.start()
        self.sink = EventSink(self.layer, loop=self.aloop)
        self._buffers: dict[str, collections.deque] = {}
        self.loop = WorkerLoop(queue=self.queue, model=MODEL, sink=self.sink, engine=engine, worker_id="w-test",
                               **loop_options)
        self.thread = threading.Thread(target=self.loop.run, daemon=True)
        self.thread.start()

    def receive(self, channel: str, timeout: float = 60.0) -> dict:
        """The next event on `channel`, in its wire form (the worker sends them in batches)."""
        buffer = self._buffers.setdefault(channel, collections.deque())
        while not buffer:
            coro = asyncio.wait_for(self.layer.receive(channel), timeout)
            message = asyncio.run_coroutine_threadsafe(coro, self.aloop).result()
            buffer.extend(events_unpack(message))
        return buffer.popleft()

    def collect(self, channel: str) -> tuple[list[dict], dict]:
        deltas = []
        while True:
            event = self.receive(channel)
            if event["type"] == "engine.done":
                return deltas, event
            assert event["type"] == "engine.delta"
            deltas.append(event)

    def close(self) -> None:
        if self.aloop.is_closed():
            return
        self.loop.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive()
        self.sink.close()
        self.aloop.call_soon_threadsafe(self.aloop.stop)
        self.aloop_thread.join()
        self.aloop.close()


@pytest.fixture
def harness_factory(engine):
    made = []

    def make(*, engine=engine, **options) -> Harness:
        harness = Harness(engine, **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()


def chat_job(engine, tenant, text: str, *, tier: str | None = None, priority: int = 2, channel: str | None = None,
             **sampling) -> object:
    sampling = {"max_tokens": 12, "temperature": 0.0, **sampling}
    return make_job(
        model=MODEL, tenant_id=tenant.pk, tier=tier or tenant.tier.name, priority=priority,
        prompt_token_ids=engine.tokenizer.encode_chat([{"role": "user", "content": text}]),
        sampling=sampling, reply_channel=channel or f"reply.{uuid.uuid4().hex}", cache_salt=tenant.cache_salt,
        request_id=f"req-{uuid.uuid4().hex[:12]}",
    )


def _retry_locked(read):
    """The in-memory SQLite test database locks whole tables while the worker
    thread writes (shared cache, no busy wait): retry a read briefly."""
    from django.db import OperationalError

    for attempt in range(40):
        try:
            return read()
        except OperationalError as exc:
            if "locked" not in str(exc) or attempt == 39:
                raise
            time.sleep(0.05)


def record(request_id: str) -> UsageRecord:
    return _retry_locked(lambda: UsageRecord.objects.get(request_id=request_id))


def record_count(**filters) -> int:
    return _retry_locked(lambda: UsageRecord.objects.filter(**filters).count())


def test_stream_equals_offline_text_and_usage_matches(engine, harness_factory, tenant_factory):
    from inference.engine import SamplingParams

    tenant = tenant_factory()
    job = chat_job(engine, tenant, "Name three colours.", max_tokens=16)
    offline = engine.generate([job.prompt_token_ids], SamplingParams(max_tokens=16, temperature=0.0))[0]

    harness = harness_factory()
    harness.queue.enqueue(job)
    deltas, done = harness.collect(job.reply_channel)
    text = "".join(d["text"] for d in deltas)
    streamed_ids = [t for d in deltas for t in d["token_ids"]]
    assert text == offline.delta_text and streamed_ids == offline.new_token_ids
    assert done["finish_reason"] == offline.finish_reason
    assert done["usage"]["prompt_tokens"] == len(job.prompt_token_ids) == offline.usage.prompt_tokens
    assert done["usage"]["completion_tokens"] == len(streamed_ids) == offline.usage.completion_tokens
    assert done["timing"]["ttft_s"] is not None and done["timing"]["e2e_s"] >= done["timing"]["ttft_s"]
    row = record(job.request_id)
    assert (row.prompt_tokens, row.completion_tokens, row.cached_tokens) == (
        done["usage"]["prompt_tokens"], done["usage"]["completion_tokens"], done["usage"]["cached_tokens"])
    assert row.finish_reason == done["finish_reason"] and row.worker_id == "w-test" and row.tenant_id == tenant.pk
    assert harness.queue.leases("w-test") == {}  # completed


def test_concurrent_requests_each_stream_their_own_text(engine, harness_factory, tenant_factory):
    tenant = tenant_factory()
    harness = harness_factory()
    jobs = [chat_job(engine, tenant, prompt, max_tokens=10)
            for prompt in ("Count to five.", "What is the capital of France?", "Write a haiku about rain.")]
    for job in jobs:
        harness.queue.enqueue(job)
    for job in jobs:
        deltas, done = harness.collect(job.reply_channel)
        ids = [t for d in deltas for t in d["token_ids"]]
        assert "".join(d["text"] for d in deltas) == engine.tokenizer.decode(ids)
        assert done["usage"]["completion_tokens"] == len(ids) > 0
        assert record(job.request_id).completion_tokens == len(ids)
    assert record_count(request_id__in=[j.request_id for j in jobs]) == 3
    # the loop timed its busy passes: the intake interval it reports to routing's step-aware wait
    assert 0 < harness.loop.intake_clock.every_s < 30
    live = harness.queue.live_workers(MODEL)
    assert live and live[0]["worker_id"] == "w-test" and live[0]["device"] == "cpu"
    assert {"running", "waiting", "kv_usage", "tok_s"} <= set(live[0])


def test_cancel_mid_stream_aborts_frees_blocks_and_bills_what_was_generated(engine, harness_factory, tenant_factory):
    tenant = tenant_factory()
    harness = harness_factory()
    job = chat_job(engine, tenant, "Tell me a long story about a dragon.", max_tokens=300, ignore_eos=True)
    harness.queue.enqueue(job)
    deltas = [harness.receive(job.reply_channel) for _ in range(3)]
    assert all(d["type"] == "engine.delta" for d in deltas)
    assert harness.queue.cancel(job.request_id) == "signalled"
    rest, done = harness.collect(job.reply_channel)
    generated = sum(len(d["token_ids"]) for d in deltas + rest)
    assert done["finish_reason"] == "abort"
    assert done["usage"]["completion_tokens"] == generated < 300
    row = record(job.request_id)
    assert row.finish_reason == "abort" and row.completion_tokens == generated
    assert record_count(request_id=job.request_id) == 1
    harness.close()  # stop the thread before reading the engine from here
    stats = engine.stats()
    assert stats["free_blocks"] == stats["num_blocks"] and stats["running"] == 0


def test_cancel_while_queued_ends_with_abort_and_a_zero_token_record(engine, harness_factory, tenant_factory):
    tenant = tenant_factory()
    harness = harness_factory(max_num_seqs=1, prefetch=0)
    busy = chat_job(engine, tenant, "Describe the sea.", max_tokens=40, ignore_eos=True)
    harness.queue.enqueue(busy)
    assert harness.receive(busy.reply_channel)["type"] == "engine.delta"  # the worker is full now
    waiting = chat_job(engine, tenant, "Hello")
    harness.queue.enqueue(waiting)
    assert harness.queue.cancel(waiting.request_id) == "dropped"
    deltas, done = harness.collect(waiting.reply_channel)
    assert deltas == [] and done["finish_reason"] == "abort" and done["usage"]["completion_tokens"] == 0
    assert record(waiting.request_id).completion_tokens == 0
    harness.collect(busy.reply_channel)


def test_saturated_worker_serves_enterprise_queued_after_free_first(engine, harness_factory, tenant_factory, tier_factory):
    free = tenant_factory(tier=tier_factory("free", priority=2, queue_weight=1))
    enterprise = tenant_factory(tier=tier_factory("enterprise", priority=0, queue_weight=8))
    harness = harness_factory(max_num_seqs=2, prefetch=0)
    blockers = [chat_job(engine, free, f"Story number {i}", max_tokens=24, ignore_eos=True) for i in range(2)]
    for job in blockers:
        harness.queue.enqueue(job)
    for job in blockers:
        assert harness.receive(job.reply_channel)["type"] == "engine.delta"
    shared = f"reply.order.{uuid.uuid4().hex}"
    late = [chat_job(engine, free, f"free {i}", channel=shared, max_tokens=3) for i in range(3)]
    late += [chat_job(engine, enterprise, f"enterprise {i}", channel=shared, priority=0, max_tokens=3)
             for i in range(3)]
    for job in late:  # all free jobs are queued before any enterprise job
        harness.queue.enqueue(job)
    tier_of = {job.request_id: job.tier for job in late}
    first_seen: list[str] = []
    finished = 0
    while finished < len(late):
        event = harness.receive(shared)
        if event["request_id"] not in first_seen:
            first_seen.append(event["request_id"])
        finished += event["type"] == "engine.done"
    assert [tier_of[rid] for rid in first_seen[:3]] == ["enterprise"] * 3
    for job in blockers:
        harness.collect(job.reply_channel)


def test_two_tenants_flooding_one_tier_are_served_interleaved(engine, harness_factory, tenant_factory, tier_factory):
    tier = tier_factory("pro", priority=1, queue_weight=4)
    flooder, other = tenant_factory(tier=tier), tenant_factory(tier=tier)
    harness = harness_factory(max_num_seqs=1, prefetch=0)
    blocker = chat_job(engine, flooder, "Warm up", max_tokens=12, ignore_eos=True)
    harness.queue.enqueue(blocker)
    assert harness.receive(blocker.reply_channel)["type"] == "engine.delta"
    shared = f"reply.rr.{uuid.uuid4().hex}"
    jobs = [chat_job(engine, flooder, f"flood {i}", channel=shared, max_tokens=2, ignore_eos=True) for i in range(6)]
    jobs += [chat_job(engine, other, f"other {i}", channel=shared, max_tokens=2, ignore_eos=True) for i in range(2)]
    for job in jobs:  # the flood is queued entirely before the other tenant's jobs
        harness.queue.enqueue(job)
    owner = {job.request_id: job.tenant_id for job in jobs}
    order = []
    while len(order) < len(jobs):
        event = harness.receive(shared)
        if event["type"] == "engine.done":
            order.append(owner[event["request_id"]])
    f, o = flooder.pk, other.pk
    assert order == [f, o, f, o, f, f, f, f]
    harness.collect(blocker.reply_channel)


def test_a_bad_request_fails_alone_and_the_loop_keeps_serving(engine, harness_factory, tenant_factory):
    tenant = tenant_factory()
    harness = harness_factory()
    bad = chat_job(engine, tenant, "hi", top_p=5.0)
    too_long = chat_job(engine, tenant, "hi", max_tokens=engine.max_model_len)
    good = chat_job(engine, tenant, "Say yes.", max_tokens=4)
    for job in (bad, too_long, good):
        harness.queue.enqueue(job)
    _, done = harness.collect(bad.reply_channel)
    assert done["finish_reason"] == "error" and "top_p" in done["error"] and done["error_param"] == "top_p"
    _, done = harness.collect(too_long.reply_channel)
    assert done["finish_reason"] == "error" and "context length" in done["error"]
    deltas, done = harness.collect(good.reply_channel)
    assert done["finish_reason"] in ("stop", "length") and deltas
    assert record(bad.request_id).finish_reason == "error" and record(good.request_id).completion_tokens > 0


def test_drain_finishes_running_work_and_takes_no_more(engine, harness_factory, tenant_factory):
    tenant = tenant_factory()
    harness = harness_factory()
    running = chat_job(engine, tenant, "List some fruit.", max_tokens=20, ignore_eos=True)
    harness.queue.enqueue(running)
    assert harness.receive(running.reply_channel)["type"] == "engine.delta"
    harness.loop.request_drain()
    later = chat_job(engine, tenant, "Too late")
    harness.queue.enqueue(later)
    deltas, done = harness.collect(running.reply_channel)
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 20
    harness.thread.join(30)
    assert not harness.thread.is_alive()
    assert harness.queue.depth(MODEL, later.tier) == 1  # still queued for another worker
    assert harness.queue.live_workers(MODEL) == []  # unregistered on exit
    assert record_count(request_id=later.request_id) == 0


@pytest.fixture
def held_records(monkeypatch):
    """(writing, gate, sizes): the finisher's usage-record writes set `writing`, then wait until the
    test sets `gate`; `sizes` gets the number of records of each write."""
    from inference.worker import ending_thread

    writing, gate, sizes = threading.Event(), threading.Event(), []
    write = ending_thread.endings_record

    def held(records):
        sizes.append(len(records))
        writing.set()
        assert gate.wait(60)
        return write(records)

    monkeypatch.setattr(ending_thread, "endings_record", held)
    return writing, gate, sizes


def start_until_a_record_is_held(engine, harness, tenant, writing, jobs: list[tuple[str, int]]) -> list:
    """Queue one chat job per (prompt, max_tokens) (ignore_eos) and wait until the finisher's first
    write is held: the first of them finished."""
    made = [chat_job(engine, tenant, text, max_tokens=n, ignore_eos=True) for text, n in jobs]
    for job in made:
        harness.queue.enqueue(job)
    assert writing.wait(60)
    return made


def test_usage_records_are_written_off_the_engine_thread_and_each_precedes_its_done_event(
        engine, harness_factory, tenant_factory, held_records):
    writing, gate, _sizes = held_records
    tenant = tenant_factory()
    harness = harness_factory()
    # the short one finishes first; its record is being written (and held)
    short, long = start_until_a_record_is_held(engine, harness, tenant, writing,
                                               [("Say hi.", 2), ("Describe a forest.", 16)])
    # the engine steps on meanwhile: the long request streams all its tokens
    assert [harness.receive(long.reply_channel)["type"] for _ in range(16)] == ["engine.delta"] * 16
    assert record_count(request_id=short.request_id) == 0
    gate.set()
    deltas, done = harness.collect(short.reply_channel)
    assert len(deltas) == 2 and done["usage"]["completion_tokens"] == 2
    assert record(short.request_id).completion_tokens == 2  # written before its done event went out
    assert harness.collect(long.reply_channel)[1]["usage"]["completion_tokens"] == 16
    assert record(long.request_id).completion_tokens == 16
    assert harness.queue.leases("w-test") == {}  # both leases released after their records


def test_a_finisher_that_fell_behind_writes_what_piled_up_in_one_insert(
        engine, harness_factory, tenant_factory, held_records):
    writing, gate, sizes = held_records
    tenant = tenant_factory()
    harness = harness_factory()
    # the first one's record is being written (and held)
    first, *later = start_until_a_record_is_held(engine, harness, tenant, writing,
                                                 [("One.", 1)] + [(f"Count to {n}.", n) for n in (2, 3, 4)])
    for job, n in zip(later, (2, 3, 4)):  # the others end in later steps meanwhile
        assert [harness.receive(job.reply_channel)["type"] for _ in range(n)] == ["engine.delta"] * n
    gate.set()
    for job, n in zip([first, *later], (1, 2, 3, 4)):
        assert harness.collect(job.reply_channel)[1]["usage"]["completion_tokens"] == n
        assert record(job.request_id).completion_tokens == n
    assert sizes[0] == 1 and sum(sizes) == 4
    assert max(sizes[1:]) >= 2  # the finishes of different steps went into one insert
    assert harness.queue.leases("w-test") == {}


def test_a_finisher_that_falls_behind_holds_the_engine_back(engine, harness_factory, tenant_factory, held_records):
    writing, gate, _sizes = held_records
    tenant = tenant_factory()
    harness = harness_factory()
    harness.loop.finisher.backlog = 1
    # the first one's record is held; the second one's finish must wait for it
    first, second, long = start_until_a_record_is_held(
        engine, harness, tenant, writing, [("One.", 1), ("Three.", 3), ("Describe a mountain.", 16)])
    streamed = 0
    with pytest.raises(TimeoutError):
        while True:
            assert harness.receive(long.reply_channel, timeout=3)["type"] == "engine.delta"
            streamed += 1
    assert 1 <= streamed < 16  # the engine stopped at the second one's finish
    gate.set()
    assert harness.collect(long.reply_channel)[1]["usage"]["completion_tokens"] == 16
    for job, tokens in ((first, 1), (second, 3), (long, 16)):
        assert record(job.request_id).completion_tokens == tokens


def test_a_step_that_fails_once_is_rerun_in_parts_and_every_request_goes_on(engine, harness_factory,
                                                                           tenant_factory, monkeypatch):
    """Fault injection: the model runner raises once, as a transient kernel failure would. The engine
    reruns the step's batch in parts, so nobody's request ends."""
    tenant = tenant_factory()
    real_run = engine.runner.run
    calls = {"n": 0}

    def run_failing_once(ids, pos, meta, *args, **kwargs):
        # Fail the first step that holds both victims, whatever the timing of their leases.
        if calls["n"] == 0 and meta.num_seqs == 2:
            calls["n"] += 1
            raise RuntimeError("injected kernel failure")
        return real_run(ids, pos, meta, *args, **kwargs)

    monkeypatch.setattr(engine.runner, "run", run_failing_once)
    harness = harness_factory()
    victims = [chat_job(engine, tenant, f"Story {i}", max_tokens=30, ignore_eos=True) for i in range(2)]
    for job in victims:
        harness.queue.enqueue(job)
    for job in victims:
        deltas, done = harness.collect(job.reply_channel)
        assert done["finish_reason"] == "length" and done["error"] is None
        assert sum(len(d["token_ids"]) for d in deltas) == 30 == record(job.request_id).completion_tokens
    assert calls["n"] == 1
    harness.close()
    stats = engine.stats()
    assert stats["free_blocks"] == stats["num_blocks"]
    assert engine.dead is None


@pytest.fixture(scope="module")
def engine_f32(engine):
    """A float32 engine (its own weights): the tokens of a request alone and in a batch are the same."""
    from inference.engine import Engine, EngineConfig

    return Engine(EngineConfig(model=MODEL, device="cpu", dtype="float32", kv_cache_mb=64, max_num_seqs=8,
                               max_num_batched_tokens=512))


def test_a_request_whose_sampling_raises_ends_alone_while_two_tenants_stream_on(
        engine_f32, harness_factory, tenant_factory, monkeypatch):
    from inference.engine import SamplingParams

    engine = engine_f32
    tenant_a, tenant_b = tenant_factory(), tenant_factory()
    streams = [chat_job(engine, tenant_a, "Tell me about the sea.", max_tokens=24, ignore_eos=True),
               chat_job(engine, tenant_b, "Count from one to twenty.", max_tokens=24, ignore_eos=True),
               chat_job(engine, tenant_b, "Describe a forest.", max_tokens=24, ignore_eos=True, temperature=0.8,
                        seed=7)]
    alone = {}
    for job in streams:  # each alone, on the same engine
        sp = SamplingParams.from_dict(dict(job.sampling))
        alone[job.request_id] = engine.generate([job.prompt_token_ids], sp)[0].new_token_ids
    bad = chat_job(engine, tenant_a, "Hello there.", max_tokens=24, ignore_eos=True)
    real_launch = engine.sampler.launch
    hits = {"n": 0}

    def launch(logits, seqs):  # the test hook: this request's sampling raises from its fourth token on
        if any(seq.request_id == bad.request_id for seq in seqs):
            hits["n"] += 1
            if hits["n"] > 3:
                raise RuntimeError("sampling failed for this request")
        return real_launch(logits, seqs)

    monkeypatch.setattr(engine.sampler, "launch", launch)
    harness = harness_factory(engine=engine)
    for job in streams + [bad]:
        harness.queue.enqueue(job)
    deltas, done = harness.collect(bad.reply_channel)
    assert done["finish_reason"] == "error" and "sampling failed for this request" in done["error"]
    assert done["usage"]["completion_tokens"] == sum(len(d["token_ids"]) for d in deltas) == 3
    for job in streams:
        deltas, done = harness.collect(job.reply_channel)
        assert done["finish_reason"] == "length" and done["error"] is None
        assert [t for d in deltas for t in d["token_ids"]] == alone[job.request_id], job.request_id
    rows = _retry_locked(lambda: list(UsageRecord.objects.filter(
        request_id__in=[j.request_id for j in streams + [bad]]).values_list("request_id", "finish_reason")))
    assert sorted(rows) == sorted([(j.request_id, "length") for j in streams] + [(bad.request_id, "error")])
    harness.close()
    engine.block_manager.check_invariants([])
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_a_step_that_always_raises_ends_every_request_once_and_stops_intake(engine, harness_factory,
                                                                             tenant_factory, monkeypatch):
    from inference.engine import Engine

    broken = Engine(engine.config, loaded=engine.loaded)  # a device that fails every step, on its own engine

    def run(*args, **kwargs):
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(broken.runner, "run", run)
    tenant = tenant_factory()
    harness = harness_factory(engine=broken)
    jobs = [chat_job(broken, tenant, f"Question {i}?", max_tokens=8) for i in range(3)]
    for job in jobs:
        harness.queue.enqueue(job)
    for job in jobs:
        deltas, done = harness.collect(job.reply_channel)
        assert not deltas and done["finish_reason"] == "error" and "device-side assert" in done["error"]
        assert record_count(request_id=job.request_id) == 1
    harness.thread.join(30)
    assert not harness.thread.is_alive()  # the loop returned: it takes no more work
    assert harness.loop.draining and broken.dead
    late = chat_job(broken, tenant, "Anyone there?", max_tokens=4)
    harness.queue.enqueue(late)
    assert harness.queue.depth(MODEL, tenant.tier.name) == 1  # queued for a healthy worker
    assert harness.queue.leases("w-test") == {}
    broken.block_manager.check_invariants([])


def test_a_step_longer_than_the_heartbeat_timeout_does_not_get_the_worker_reaped(engine, harness_factory,
                                                                                 tenant_factory, monkeypatch):
    """A prefill on a slow CPU can take longer than WORKER_HEARTBEAT_TIMEOUT_S. Here one step is held for
    2.5 s against a 1 s timeout while another worker's reaper runs: the worker stays live (its side thread
    repeats the heartbeat during the step), nothing is reaped, the request ends normally, once."""
    from inference.worker.reaper import dead_workers_reap

    tenant = tenant_factory()
    real_step = engine.step
    slow = threading.Event()

    def step_once_slowly():
        if engine.has_unfinished() and not slow.is_set():
            slow.set()
            time.sleep(2.5)
        return real_step()

    monkeypatch.setattr(engine, "step", step_once_slowly)
    harness = harness_factory(heartbeat_timeout=1.0, heartbeat_interval=0.2)
    job = chat_job(engine, tenant, "Say hello.", max_tokens=6)
    harness.queue.enqueue(job)
    assert slow.wait(30)
    seen_live, reaped = [], []
    for _ in range(10):  # 2 s of the 2.5 s step: another worker reaping every 0.2 s
        time.sleep(0.2)
        seen_live.append(any(w["worker_id"] == "w-test" for w in harness.queue.live_workers(MODEL)))
        reaped.append(dead_workers_reap(queue=harness.queue, sink=harness.sink))
    assert all(seen_live)
    assert not any(r.requeued or r.failed for r in reaped)
    deltas, done = harness.collect(job.reply_channel)
    assert done["finish_reason"] in ("stop", "length") and deltas
    assert record_count(request_id=job.request_id) == 1
    assert harness.queue.leases("w-test") == {}


async def test_embedded_worker_starts_once_and_delivers_on_the_web_loop(engine, tenant_factory, settings,
                                                                      monkeypatch):
    """ensure_embedded_worker() from the event loop, as the API calls it; the real engine is shared."""
    from asgiref.sync import sync_to_async
    from channels.layers import get_channel_layer

    from inference import queue as queue_module
    from inference.worker import embedded

    settings.REDIS_URL = ""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    queue_module.reset_job_queue()
    monkeypatch.setattr(embedded, "engine_build", lambda **options: engine)
    tenant = await sync_to_async(tenant_factory)()
    await asyncio.to_thread(embedded.embedded_worker_stop)  # none left by an earlier test, bound to another queue
    try:
        workers = await asyncio.gather(*(asyncio.to_thread(embedded.ensure_embedded_worker, MODEL) for _ in range(4)))
        worker = embedded.ensure_embedded_worker(MODEL)  # on the loop: binds it for deliveries
        assert all(w is worker for w in workers)
        layer = get_channel_layer()
        channel = await layer.new_channel("reply.")
        job = chat_job(engine, tenant, "Say hello.", max_tokens=6, ignore_eos=True, channel=channel)
        queue_module.get_job_queue().enqueue(job)
        texts, event = [], {}
        while event.get("type") != "engine.done":
            message = await asyncio.wait_for(layer.receive(channel), 60)
            for event in events_unpack(message):
                if event["type"] == "engine.delta":
                    texts.append(event["text"])
        assert event["usage"]["completion_tokens"] == 6 and "".join(texts)
        row = await sync_to_async(record)(job.request_id)
        assert row.completion_tokens == 6 and row.worker_id == worker.worker_id
    finally:
        await asyncio.to_thread(embedded.embedded_worker_stop)
        queue_module.reset_job_queue()
        from django.db import connections

        await sync_to_async(connections.close_all)()  # the executor thread's connection


def test_a_new_requests_first_token_leads_its_steps_batch(engine, harness_factory, tenant_factory):
    """Within one step's message, a request's first delta comes before the running streams' deltas."""
    tenant = tenant_factory()
    harness = harness_factory()
    channel = f"reply.{uuid.uuid4().hex}"
    running = chat_job(engine, tenant, "Count to one hundred.", channel=channel, max_tokens=60, ignore_eos=True)
    harness.queue.enqueue(running)

    def next_batch() -> list[dict]:
        coro = asyncio.wait_for(harness.layer.receive(channel), 60)
        return events_unpack(asyncio.run_coroutine_threadsafe(coro, harness.aloop).result())

    while not any(e["type"] == "engine.delta" for e in next_batch()):
        pass  # the running request streams
    newcomer = chat_job(engine, tenant, "Say hi.", channel=channel, max_tokens=4)
    harness.queue.enqueue(newcomer)
    while True:
        batch = next_batch()
        ids = [e["request_id"] for e in batch if e["type"] == "engine.delta"]
        if newcomer.request_id in ids:
            break
    assert running.request_id in ids  # the step that produced the first token also decoded the other
    assert ids[0] == newcomer.request_id


def test_steps_with_first_tokens_wait_until_their_events_are_sent(engine, harness_factory, tenant_factory):
    """The engine thread waits (bounded) for the sink only when a step carries a first token."""
    from inference.worker.loop import FIRST_TOKEN_SEND_WAIT_S

    tenant = tenant_factory()
    harness = harness_factory()
    calls: list[tuple[bool, float]] = []
    send_many = harness.sink.send_many

    def recording(items, *, wait_s=0.0):
        has_first = any(type(event) is Delta and event.request_id not in seen for _c, event in items)
        seen.update(event.request_id for _c, event in items if type(event) is Delta)
        calls.append((has_first, wait_s))
        send_many(items, wait_s=wait_s)

    seen: set[str] = set()
    harness.sink.send_many = recording
    channel = f"reply.{uuid.uuid4().hex}"
    job = chat_job(engine, tenant, "Count to ten.", channel=channel, max_tokens=5, ignore_eos=True)
    harness.queue.enqueue(job)
    deltas, done = harness.collect(channel)
    assert len(deltas) == 5 and done["finish_reason"] == "length"
    delta_calls = [call for call in calls if call[0] or call[1]]
    assert delta_calls[0] == (True, FIRST_TOKEN_SEND_WAIT_S)
    assert all(wait == 0.0 for has_first, wait in calls if not has_first)


class _LostLeaseQueue(MemoryJobQueue):
    """The in-process queue flagged remote, whose marks find the lease lost (the reaper took it meanwhile):
    a real lost lease on Redis would be requeued and served again, which is not what this test watches."""

    remote = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marks: list[tuple[str, list[str]]] = []

    def mark_started(self, worker_id, request_ids):
        self.marks.append((threading.current_thread().name, list(request_ids)))
        super().mark_started(worker_id, request_ids)
        return set()


def _remote_harness(harness_factory, queue) -> Harness:
    harness = harness_factory()
    harness.loop.request_stop()
    harness.thread.join(30)
    harness.queue = queue
    harness.loop = WorkerLoop(queue=queue, model=MODEL, sink=harness.sink, engine=harness.engine, worker_id="w-test")
    harness.thread = threading.Thread(target=harness.loop.run, daemon=True)
    harness.thread.start()
    return harness


def test_a_redis_queue_gets_first_tokens_marked_during_the_step(engine, harness_factory, tenant_factory):
    """On the real Redis queue: each first token's lease is marked once, from the step's side thread."""
    from inference.queue.redis_backend import RedisJobQueue
    from tests.inference.queue_helpers import REDIS_TEST_URL, require_redis

    require_redis()
    queue = RedisJobQueue(url=REDIS_TEST_URL, prefix=f"test:{uuid.uuid4().hex}",
                          weights={"free": 1, "pro": 4, "enterprise": 8}, heartbeat_timeout=5.0)
    marks: list[tuple[str, list[str]]] = []
    mark_started = queue.mark_started

    def recording(worker_id, request_ids):  # records who called, then the real script
        marks.append((threading.current_thread().name, list(request_ids)))
        return mark_started(worker_id, request_ids)

    queue.mark_started = recording
    tenant = tenant_factory()
    harness = _remote_harness(harness_factory, queue)
    try:
        jobs = [chat_job(engine, tenant, text, max_tokens=4) for text in ("Say hi.", "Name a colour.")]
        for job in jobs:
            queue.enqueue(job)
        for job in jobs:
            deltas, done = harness.collect(job.reply_channel)
            assert len(deltas) >= 1 and done["finish_reason"] in {"stop", "length"}
            assert record(job.request_id).completion_tokens == done["usage"]["completion_tokens"]
        marked = [rid for _thread, ids in marks for rid in ids]
        assert sorted(marked) == sorted(job.request_id for job in jobs)  # each once...
        assert {thread for thread, _ids in marks} == {"mark-started_0"}  # ...from the step's side thread
    finally:
        harness.close()
        queue.flush()


def test_a_first_token_whose_lease_was_lost_during_the_step_is_not_sent(engine, harness_factory, tenant_factory):
    """Marked during the step but reaped meanwhile: aborted, nothing sent, the engine holds nothing."""
    tenant = tenant_factory()
    harness = _remote_harness(harness_factory, _LostLeaseQueue(weights={"free": 1, "pro": 4, "enterprise": 8},
                                                               heartbeat_timeout=5.0))
    job = chat_job(engine, tenant, "Say hi.", max_tokens=4)
    harness.queue.enqueue(job)
    deadline = time.monotonic() + 30
    while not harness.queue.marks and time.monotonic() < deadline:
        time.sleep(0.05)
    assert harness.queue.marks and harness.queue.marks[0][0] == "mark-started_0"
    while (job.request_id in harness.loop.active or engine.has_unfinished()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job.request_id not in harness.loop.active and not engine.has_unfinished()
    with pytest.raises(asyncio.TimeoutError):
        harness.receive(job.reply_channel, timeout=0.5)
