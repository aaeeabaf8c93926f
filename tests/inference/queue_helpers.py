"""Helpers for the queue and worker tests: jobs, and both queue backends.

The Redis backend runs against the real server (db 2, or QUEUE_TEST_REDIS_URL)
with every test's keys under its own prefix. Without a server the Redis cases
skip locally and fail under CI=true.
"""

from __future__ import annotations

import itertools
import os
import time
import uuid

import pytest

from inference.api.replies import Mailbox
from inference.protocol import BATCH, Batch
from inference.queue.job import Job
from inference.queue.memory import MemoryJobQueue
from inference.queue.redis_backend import RedisJobQueue

REDIS_TEST_URL = os.environ.get("QUEUE_TEST_REDIS_URL", "redis://127.0.0.1:6379/2")
_ids = itertools.count(1)
_redis_ok: bool | None = None


def events_unpack(message: dict) -> list[dict]:
    """The events of a worker's reply-channel message, decoded, then in their wire form again (what
    the tests read: `event["type"]`, `event["usage"]["completion_tokens"]`, ...)."""
    assert message["type"] == BATCH, message
    return [event.encode() for event in Batch.decode(message).events]


def redis_available() -> bool:
    global _redis_ok
    if _redis_ok is None:
        import redis

        try:
            _redis_ok = bool(redis.Redis.from_url(REDIS_TEST_URL, socket_connect_timeout=1).ping())
        except redis.RedisError:
            _redis_ok = False
    return _redis_ok


def require_redis() -> None:
    if not redis_available():
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Redis at {REDIS_TEST_URL} is required under CI")
        pytest.skip(f"Redis at {REDIS_TEST_URL} is not running")


def make_job(*, tier: str = "free", tenant_id: int = 1, model: str = "m", request_id: str | None = None,
             enqueued_at: float | None = None, **fields) -> Job:
    return Job(
        request_id=request_id or f"req-{next(_ids)}",
        tenant_id=tenant_id,
        api_key_id=fields.pop("api_key_id", None),
        tier=tier,
        priority=fields.pop("priority", 2),
        model=model,
        prompt_token_ids=fields.pop("prompt_token_ids", [1, 2, 3]),
        sampling=fields.pop("sampling", {"max_tokens": 4}),
        reply_channel=fields.pop("reply_channel", "reply.test"),
        enqueued_at=time.time() if enqueued_at is None else enqueued_at,
        **fields,
    )


@pytest.fixture(params=["memory", "redis"])
def queue_factory(request):
    """make(**options) -> a fresh, empty queue of the parametrized backend."""
    made = []

    def make(**options):
        if request.param == "memory":
            queue = MemoryJobQueue(**options)
        else:
            require_redis()
            queue = RedisJobQueue(url=REDIS_TEST_URL, prefix=f"test:{uuid.uuid4().hex}", **options)
        made.append(queue)
        return queue

    make.backend = request.param
    yield make
    for queue in made:
        queue.flush()


class OneMailboxReply:
    """A reply channel (inference.api.replies.ReplyChannel's part a JobRun uses) with one mailbox for every
    request: a test puts events in `mailbox` and reads them through a JobRun."""

    def __init__(self, name: str = "reply.test!") -> None:
        self.name = name
        self.mailbox = Mailbox()

    def register(self, request_id):
        return self.mailbox

    def unregister(self, request_id):
        self.mailbox.close()
