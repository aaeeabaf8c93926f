"""The embedded mode's batch runner: a task on the web server's event loop (one process, no Redis).

`runner_on_batch_requests(app)` wraps the ASGI application: a `/v1/batches` request starts the runner on
this loop when none runs (settings.BATCH_RUNNER_EMBEDDED, on by default where the engine is embedded). The
runner ends itself after a minute with no batch in progress; the next `/v1/batches` request (a new batch, or
a client polling one) starts it again, also after a restart that left batches in progress. It runs on the
web's loop because the embedded engine delivers its events there (inference.worker.events).
"""

from __future__ import annotations

import asyncio
import logging

from django.conf import settings

logger = logging.getLogger(__name__)

IDLE_EXIT_S = 60.0
_task: asyncio.Task | None = None


def embedded_runner_ensure() -> asyncio.Task:
    """The runner task on the running loop, started if none runs there."""
    global _task
    loop = asyncio.get_running_loop()
    if _task is None or _task.done() or _task.get_loop() is not loop:
        from batches.runner import BatchRunner

        _task = loop.create_task(BatchRunner().run(idle_exit_s=IDLE_EXIT_S), name="batch-runner")
    return _task


async def embedded_runner_stop() -> None:
    """Stop the runner of this loop (tests): its lines in hand go back to pending."""
    global _task
    task, _task = _task, None
    if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def runner_on_batch_requests(app):
    async def application(scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/batches") and settings.BATCH_RUNNER_EMBEDDED:
            embedded_runner_ensure()
        await app(scope, receive, send)

    return application
