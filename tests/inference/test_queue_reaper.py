"""Reaping a dead worker end to end: requeue, error event, one usage record."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from channels.layers import InMemoryChannelLayer

from inference.api.replies import events_unpack
from inference.worker.events import EventSink
from inference.worker.reaper import dead_workers_reap
from billing.models import UsageRecord
from tests.inference.queue_helpers import make_job, queue_factory  # noqa: F401 - fixture


@pytest.fixture
def channel():
    """An in-memory channel layer served by its own event loop thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    layer = InMemoryChannelLayer()
    sink = EventSink(layer, loop=loop)

    def receive(name: str, timeout: float = 5.0) -> dict:
        """The one event of the (single-event) batch message on `name`."""
        message = asyncio.run_coroutine_threadsafe(asyncio.wait_for(layer.receive(name), timeout), loop).result()
        (event,) = events_unpack(message)
        return event

    yield sink, receive
    sink.close()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


@pytest.mark.django_db
def test_dead_worker_started_job_fails_with_error_event_and_one_record(queue_factory, channel, tenant_factory):
    sink, receive = channel
    tenant = tenant_factory()
    queue = queue_factory(heartbeat_timeout=0.3)
    started = make_job(tenant_id=tenant.pk, tier=tenant.tier.name, reply_channel="reply.started", prompt_token_ids=[5] * 9)
    unstarted = make_job(tenant_id=tenant.pk, tier=tenant.tier.name, reply_channel="reply.unstarted")
    queue.enqueue(started)
    queue.enqueue(unstarted)
    queue.heartbeat("doomed", "m", {})
    assert len(queue.lease("doomed", "m", 2)) == 2
    queue.mark_started("doomed", [started.request_id])
    time.sleep(0.4)

    result = dead_workers_reap(queue=queue, sink=sink)
    assert result.dead_workers == ["doomed"] and result.requeued == [unstarted.request_id]
    done = receive("reply.started")
    assert done["type"] == "engine.done" and done["request_id"] == started.request_id
    assert done["finish_reason"] == "error" and "stopped" in done["error"]
    assert done["usage"]["prompt_tokens"] == 9
    record = UsageRecord.objects.get(request_id=started.request_id)
    assert record.finish_reason == "error" and record.worker_id == "doomed" and record.tenant_id == tenant.pk
    # The unstarted one is queued again, untouched, with no record.
    assert [j.request_id for j in queue.lease("other", "m", 5)] == [unstarted.request_id]
    assert not UsageRecord.objects.filter(request_id=unstarted.request_id).exists()
    # Reaping again, and finishing the same job a second time, changes nothing.
    assert dead_workers_reap(queue=queue, sink=sink).failed == []
    from inference.worker.reaper import reap_result_finish

    reap_result_finish(result=result, sink=sink)
    assert UsageRecord.objects.filter(request_id=started.request_id).count() == 1


@pytest.mark.django_db
def test_dropped_jobs_end_with_abort(queue_factory, channel, tenant_factory):
    """A job cancelled while queued still gets one done event and one record."""
    from inference.worker.finish import job_finish

    sink, receive = channel
    tenant = tenant_factory()
    queue = queue_factory()
    job = make_job(tenant_id=tenant.pk, tier=tenant.tier.name, reply_channel="reply.dropped")
    queue.enqueue(job)
    assert queue.cancel(job.request_id) == "dropped"
    for dropped in queue.take_dropped("m"):
        job_finish(job=dropped, sink=sink, worker_id="w1", finish_reason="abort")
    done = receive("reply.dropped")
    assert done["finish_reason"] == "abort" and done["usage"]["completion_tokens"] == 0
    assert UsageRecord.objects.get(request_id=job.request_id).finish_reason == "abort"


def test_celery_task_runs_the_reaper(settings):
    """The beat entry points at a registered task that reaps the configured queue."""
    from inference import queue as queue_module
    from inference.tasks import reap_dead_workers

    assert settings.CELERY_BEAT_SCHEDULE["reap-dead-workers"]["task"] == reap_dead_workers.name
    settings.REDIS_URL = ""
    queue_module.reset_job_queue()
    try:
        q = queue_module.get_job_queue()
        q.heartbeat_timeout = 0.1
        job = make_job()
        q.enqueue(job)
        q.heartbeat("gone", "m", {})
        q.lease("gone", "m", 1)
        time.sleep(0.2)
        outcome = reap_dead_workers.apply().get()
        assert outcome == {"dead_workers": ["gone"], "requeued": 1, "failed": 0}
        assert q.depth("m", "free") == 1
    finally:
        queue_module.reset_job_queue()
