"""The batch runner: runs in_progress batches' lines on spare capacity, one live request each.

    runner = BatchRunner()
    await runner.run(stop=event)       # `manage.py run_batches`; in the embedded mode a task on the web's loop

Each pass (every BATCH_POLL_S, at once after a line ends):
- renews the leases of the lines it holds and takes back lines whose runner stopped renewing them
  (batches.services.runs: a killed runner's lines run again, under the same request id, billed once);
- for each in_progress batch, oldest first, while it holds fewer than BATCH_MAX_IN_FLIGHT lines: when no
  tier's job waits for the batch's model (the job queue's depths), claims pending lines and runs each as the
  live endpoint would (batches.services.line_run): the job runs at the batch engine priority, below every
  tier, so a live request that arrives meanwhile preempts it in the engine's scheduler;
- a line's outcome is stored once (`batch_line_finish`) and the batch moved on (`batch_settle`: finalizing,
  files, completed; a cancelling batch's pending lines cancelled, then the batch once none runs; a batch past
  its window claimed no more, its pending lines expired, then the batch `expired` with its files once none runs);
- a refusal that says "later" (rate limits, a full queue) puts the line back and pauses claiming.

A cancelled batch's running lines finish (OpenAI's batches do the same): only lines that ran are billed.
Stopping the runner cancels the lines in hand (their jobs abort in the engine, billed for what they generated)
and puts them back to pending for the next runner.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from batches.models import Batch, BatchLine
from batches.services.line_run import LineOutcome, aline_run
from batches.services.runs import (
    batch_line_finish, batch_lines_claim, batch_lines_reap, batch_lines_release, batch_lines_renew, batch_settle,
)
from batches.services.transitions import S
from tenants.services.api_keys import AuthContext

logger = logging.getLogger(__name__)

ENDPOINT_KINDS = {"/v1/chat/completions": "chat.completions", "/v1/completions": "completions"}
KEY_GONE = {"error": {"message": "The API key that created this batch, or its account, can no longer be used.",
                      "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}


def runner_name() -> str:
    return f"batch-runner:{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"


def _auth(batch: Batch) -> AuthContext | None:
    """The batch's tenant, tier and key, as a live request of that key carries them (None: key unusable)."""
    key = batch.api_key
    if key is None or not key.is_usable() or not batch.tenant.is_active:
        return None
    return AuthContext(tenant=batch.tenant, tier=batch.tenant.tier, api_key=key)


def _batches_running() -> list[Batch]:
    return list(Batch.objects.filter(status__in=(S.IN_PROGRESS, S.CANCELLING))
                .select_related("tenant__tier", "api_key").order_by("created_at", "pk"))


def _window_ended(batch: Batch) -> bool:
    """An in_progress batch past its `expires_at`: none of its lines is claimed any more (batch_settle expires
    the pending ones, and the batch once its running lines end)."""
    return batch.status == S.IN_PROGRESS and batch.expires_at <= timezone.now()


def _tiers_waiting(model: str) -> bool:
    from inference.queue import get_job_queue

    return any(int(depth) > 0 for depth in get_job_queue().depths(model).values())


class BatchRunner:
    def __init__(self, *, name: str | None = None, max_in_flight: int | None = None, poll_s: float | None = None,
                 lease_s: float | None = None) -> None:
        self.name = name or runner_name()
        self.max_in_flight = max_in_flight if max_in_flight is not None else settings.BATCH_MAX_IN_FLIGHT
        self.poll_s = poll_s if poll_s is not None else settings.BATCH_POLL_S
        self.lease_s = lease_s if lease_s is not None else settings.BATCH_LEASE_S
        self.tasks: dict[asyncio.Task, BatchLine] = {}
        self._paused_until = 0.0
        self._next_renew = 0.0
        self._wake = asyncio.Event()

    # ------------------------------------------------------------ main
    async def run(self, *, stop: asyncio.Event | None = None, idle_exit_s: float | None = None) -> None:
        """Pass after pass until `stop` is set (or, with `idle_exit_s`, no batch ran for that long)."""
        stop = stop or asyncio.Event()
        idle_since = time.monotonic()
        try:
            while not stop.is_set():
                try:
                    busy = await self.run_once()
                except Exception:  # noqa: BLE001 - e.g. the database away for a moment: try again next pass
                    logger.exception("batch runner %s: pass failed", self.name)
                    busy = True
                now = time.monotonic()
                if busy or self.tasks:
                    idle_since = now
                elif idle_exit_s is not None and now - idle_since >= idle_exit_s:
                    break
                self._wake.clear()
                waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
                try:
                    await asyncio.wait(waits, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waits:
                        waiter.cancel()
        finally:
            await self.close()

    async def close(self) -> None:
        """Cancel the lines in hand and give them back to pending (their jobs abort in the engine)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await sync_to_async(batch_lines_release)(runner=self.name)
        except Exception:  # noqa: BLE001 - their leases lapse; another runner takes them back
            logger.exception("batch runner %s: could not release its lines", self.name)

    async def run_once(self) -> bool:
        """One pass; True when some batch is in progress (claimed or not)."""
        now = time.monotonic()
        if now >= self._next_renew:
            self._next_renew = now + self.lease_s / 4
            await sync_to_async(batch_lines_renew)(runner=self.name)
            reaped = await sync_to_async(batch_lines_reap)(lease_s=self.lease_s)
            if reaped:
                logger.warning("batch runner %s: %d lines whose runner stopped run again", self.name, reaped)
        batches = await sync_to_async(_batches_running)()
        for batch in batches:
            if batch.status == S.CANCELLING or _window_ended(batch):
                await sync_to_async(batch_settle)(batch=batch)  # ends it once none of its lines runs
        free = self.max_in_flight - len(self.tasks)
        if free <= 0 or now < self._paused_until:
            return bool(batches)
        for batch in batches:
            if batch.status != S.IN_PROGRESS or free <= 0 or _window_ended(batch):
                continue
            if await asyncio.to_thread(_tiers_waiting, batch.model):
                continue  # live work waits for this model: the batch waits for spare capacity
            lines = await sync_to_async(batch_lines_claim)(batch=batch, runner=self.name, limit=free)
            if not lines:
                await sync_to_async(batch_settle)(batch=batch)  # nothing pending: it may be done
                continue
            auth = _auth(batch)
            for line in lines:
                task = asyncio.create_task(self._line(batch, auth, line), name=f"batch-line-{line.request_id}")
                self.tasks[task] = line
                task.add_done_callback(self._line_done)
            free -= len(lines)
        return bool(batches)

    def _line_done(self, task: asyncio.Task) -> None:
        self.tasks.pop(task, None)
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            logger.error("batch runner %s: a line's task failed", self.name, exc_info=task.exception())

    # ------------------------------------------------------------ one line
    async def _line(self, batch: Batch, auth: AuthContext | None, line: BatchLine) -> None:
        if auth is None:
            outcome = LineOutcome(status_code=401, body=KEY_GONE)
        else:
            try:
                outcome = await aline_run(auth=auth, endpoint=ENDPOINT_KINDS[batch.endpoint], body=line.body,
                                          request_id=line.request_id, batch_id=batch.public_id)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a bug of ours: tried again, then the line fails alone
                logger.exception("batch runner %s: line %s failed", self.name, line.request_id)
                outcome = LineOutcome(status_code=500, retry=True, retry_after_s=1.0, body={"error": {
                    "message": "The server had an error while processing this request.",
                    "type": "server_error", "param": None, "code": None}})
        if outcome.retry and outcome.status_code is not None and line.attempts >= settings.BATCH_LINE_ATTEMPTS:
            outcome.retry = False  # the server's own failure, tried often enough: the line fails with it
        if outcome.retry:
            self._paused_until = max(self._paused_until, time.monotonic() + outcome.retry_after_s)
            await sync_to_async(batch_lines_release)(runner=self.name, pks=[line.pk])
            return
        await sync_to_async(self._finish)(batch, line, outcome)

    def _finish(self, batch: Batch, line: BatchLine, outcome: LineOutcome) -> None:
        if batch_line_finish(line=line, runner=self.name, status_code=outcome.status_code, body=outcome.body):
            batch_settle(batch=batch)
