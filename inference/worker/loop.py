"""The worker loop: queue -> Engine.step() -> reply channels, one request at a time ended once.

    loop = WorkerLoop(queue=q, model="smollm2-135m-instruct", engine_factory=make_engine, sink=EventSink())
    loop.run()            # until request_drain() (SIGTERM) has finished the work in hand

Each pass: heartbeat (every ~1 s; during a step longer than that, a side
thread repeats the last heartbeat so a slow step never looks like a dead
worker), reap dead workers (every few seconds),
abort what clients cancelled, end jobs dropped from the queue, lease new jobs
when the engine has room, then one engine step whose outputs become
engine.delta events and, for finished requests, a usage record and one
engine.done. An error in one request ends that request with finish_reason
"error" (the engine pins a failing step to the requests that made it fail);
an error the engine lets through ends every request in the engine; neither
stops the loop. An engine that declares itself dead (a broken device: every
request failed alone) has ended its requests once: the loop stops taking
work and returns once the requests in hand are finished.

Room: the worker holds at most max_num_seqs + prefetch jobs and leases nothing
while `prefetch` or more wait inside the engine (KV cache full). The rest stay
on the shared queue, where the tier weights decide and other workers can take
them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from inference.queue import Job, JobQueue, ReapResult

from .events import EventSink
from .finish import delta_event, job_ending, job_fail, job_finish, usage_records_safe
from .heartbeat import heartbeat_info
from .reaper import dead_workers_reap, reap_result_finish

logger = logging.getLogger(__name__)

# A step that carries first tokens waits (at most this long) until its events are sent, so the
# sending thread need not wait for the GIL through the next step's Python (EventSink.send_many).
FIRST_TOKEN_SEND_WAIT_S = 0.002


def default_worker_id(model: str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{model}:{os.urandom(3).hex()}"


@dataclass
class _Active:
    job: Job
    leased_at: float  # unix time
    started: bool = False  # lease flagged started: events may have reached the client
    first_token_at: float | None = None
    completion_tokens: int = 0
    aborting: bool = False  # cancelled by the client, abort sent to the engine

    def tokens_so_far(self) -> dict[str, int]:
        """What a request ended early is billed: its prompt only once a token was generated."""
        return {"prompt_tokens": len(self.job.prompt_token_ids) if self.completion_tokens else 0,
                "completion_tokens": self.completion_tokens}

    @property
    def ttft_s(self) -> float | None:
        """Seconds from the enqueue to the first token, if there was one."""
        return None if self.first_token_at is None else max(0.0, self.first_token_at - self.job.enqueued_at)


class WorkerLoop:
    # Steps' worth of finished requests whose records may wait for the finisher thread before the
    # loop waits for it: a database that cannot keep up slows the engine down instead of piling up.
    finish_backlog = 32

    def __init__(
        self,
        *,
        queue: JobQueue,
        model: str,
        sink: EventSink,
        engine: Any = None,
        engine_factory: Callable[[], Any] | None = None,
        worker_id: str | None = None,
        device: str = "cpu",
        max_num_seqs: int | None = None,
        prefetch: int | None = None,
        heartbeat_interval: float = 1.0,
        reap_interval: float | None = None,
        dropped_interval: float = 0.2,
    ) -> None:
        if engine is None and engine_factory is None:
            raise ValueError("WorkerLoop needs an engine or an engine_factory")
        self.queue = queue
        self.model = model
        self.sink = sink
        self.engine = engine
        self.engine_factory = engine_factory
        self.worker_id = worker_id or default_worker_id(model)
        self.device = device
        self._max_num_seqs = max_num_seqs
        self._prefetch = prefetch
        self.heartbeat_interval = heartbeat_interval
        self.reap_interval = reap_interval if reap_interval is not None else max(1.0, queue.heartbeat_timeout / 2)
        self.dropped_interval = dropped_interval
        self.active: dict[str, _Active] = {}
        self.started_at = time.time()
        self._draining = threading.Event()
        self._stopping = threading.Event()
        self._next_heartbeat = 0.0
        self._next_reap = 0.0
        self._next_dropped = 0.0
        self._tokens_since_beat = 0
        self._last_beat = time.monotonic()
        self.tok_s = 0.0
        self.steps = 0
        self._beat_lock = threading.Lock()  # the loop and the in-step beater share the queue client
        self._last_info: dict[str, Any] | None = None
        self._step_started: float | None = None  # monotonic start of the step in progress
        self._reaped_in_step = False
        self._beater_done = threading.Event()
        # Redis: the leases of a step's first tokens are flagged started from this thread while the
        # step computes, not after it (a round trip, 0.6 ms p50 on the 2-core VM, off every first token).
        self._marker = ThreadPoolExecutor(1, thread_name_prefix="mark-started") if queue.remote else None
        # The requests a step finished get their usage records (database round trips: 0.2 ms p50 but
        # 9 ms p90 of the loop's own time per step at 32 streams on a 2-core VM when written there)
        # from this thread, in order, while the engine steps on: one insert for whatever finished
        # since it last looked. Each done event still goes out after its record.
        self._finisher = ThreadPoolExecutor(1, thread_name_prefix="finish")
        self._finishing: deque[Future] = deque()  # its calls not yet done, oldest first
        self._to_finish: deque[tuple[_Active, Any, float]] = deque()  # finished, not yet taken by the finisher

    # ------------------------------------------------------------ control
    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def request_drain(self) -> None:
        """Stop leasing; finish the work in hand; then run() returns (SIGTERM)."""
        self._draining.set()

    def request_stop(self) -> None:
        """Return as soon as possible, ending the work in hand (second SIGTERM)."""
        self._draining.set()
        self._stopping.set()

    @property
    def max_num_seqs(self) -> int:
        if self._max_num_seqs is None:
            config = getattr(self.engine, "config", None)
            self._max_num_seqs = int(getattr(config, "max_num_seqs", 0) or 64)
        return self._max_num_seqs

    @property
    def prefetch(self) -> int:
        if self._prefetch is None:
            self._prefetch = max(2, self.max_num_seqs // 8)
        return self._prefetch

    # ------------------------------------------------------------ main
    def run(self) -> None:
        failures = 0
        beater = threading.Thread(target=self._beat_during_steps, name=f"{self.worker_id}-step-beats", daemon=True)
        try:
            self.load_engine()
            beater.start()
            while not self._stopping.is_set():
                try:
                    self.run_once()
                    failures = 0
                except Exception:  # noqa: BLE001 - e.g. Redis unreachable for a moment
                    failures += 1
                    logger.exception("worker loop pass failed (%d in a row); retrying", failures)
                    time.sleep(min(5.0, 0.1 * 2**failures))
                if self.draining and not self.active:
                    break
        finally:
            self._beater_done.set()
            if beater.is_alive():
                beater.join(5.0)
            self.shutdown()

    def load_engine(self) -> None:
        """Build the engine (if a factory was given), heartbeating while it loads."""
        if self.engine is not None:
            return
        done = threading.Event()

        def beat_while_loading() -> None:
            while not done.wait(self.heartbeat_interval):
                self._safe_heartbeat(self._heartbeat_info(loading=True))

        self._safe_heartbeat(self._heartbeat_info(loading=True))
        ticker = threading.Thread(target=beat_while_loading, name=f"{self.worker_id}-loading", daemon=True)
        ticker.start()
        try:
            self.engine = self.engine_factory()
        finally:
            done.set()
            ticker.join()
        logger.info("worker %s: engine for %s loaded on %s", self.worker_id, self.model, self.device)

    def run_once(self) -> None:
        now = time.monotonic()
        if now >= self._next_heartbeat:
            self.heartbeat()
        if now >= self._next_reap:
            self._next_reap = now + self.reap_interval
            try:
                dead_workers_reap(queue=self.queue, sink=self.sink)
            except Exception:  # noqa: BLE001
                logger.exception("reaping failed")
        if now >= self._next_dropped:
            self._next_dropped = now + self.dropped_interval
            self._end_dropped()
        if self.draining:
            self._abort_cancelled()
        else:
            self._intake()
        if self.active or self.engine.has_unfinished():
            self._step()
            if self.active and not self.engine.has_unfinished():
                # The engine holds nothing, yet these never finished: end them here.
                for request_id in list(self.active):
                    self._end_lost(request_id)
        elif not self.draining:
            # Enqueues, cancellations of queued jobs and requeues all wake this wait.
            wait = min(self._next_heartbeat - time.monotonic(), self.heartbeat_interval)
            if self.queue.wait_for_work(self.model, timeout=max(wait, 0.01)):
                self._next_dropped = 0.0

    # ------------------------------------------------------------ heartbeats
    def _heartbeat_info(self, *, loading: bool = False) -> dict[str, Any]:
        return heartbeat_info(self, loading=loading)

    def _safe_heartbeat(self, info: dict[str, Any]) -> bool:
        try:
            with self._beat_lock:
                return self.queue.heartbeat(self.worker_id, self.model, info)
        except Exception:  # noqa: BLE001 - Redis blips must not kill the worker
            logger.exception("heartbeat failed")
            return True

    def _beat_during_steps(self) -> None:
        """Side thread: while one engine step outlasts the heartbeat interval (a long prefill on a slow
        CPU), repeat the last heartbeat, so the worker is neither shown as gone nor reaped mid-step.
        It reads no engine state (the step owns it), only what the loop's last heartbeat reported."""
        while not self._beater_done.wait(self.heartbeat_interval / 2):
            started, info = self._step_started, self._last_info
            if started is None or info is None:
                continue
            in_step = time.monotonic() - started
            if in_step < self.heartbeat_interval:
                continue  # short steps: the loop beats between them
            if not self._safe_heartbeat(dict(info, in_step_s=round(in_step, 1))):
                self._reaped_in_step = True

    def heartbeat(self) -> None:
        now = time.monotonic()
        elapsed = now - self._last_beat
        if elapsed > 0:
            self.tok_s = self._tokens_since_beat / elapsed
        self._tokens_since_beat, self._last_beat = 0, now
        self._next_heartbeat = now + self.heartbeat_interval
        info = self._heartbeat_info()
        self._last_info = info
        if not self._safe_heartbeat(info):
            self._drop_reaped()

    def _drop_reaped(self) -> None:
        """We were reaped (too slow to heartbeat): our jobs were requeued or failed elsewhere.
        Drop them without sending anything more."""
        logger.error("worker %s was reaped; dropping %d requests", self.worker_id, len(self.active))
        for request_id in list(self.active):
            self._engine_abort(request_id)
        self.active.clear()

    # ------------------------------------------------------------ intake
    def room(self) -> int:
        try:
            waiting = int(self.engine.stats().get("waiting", 0))
        except Exception:  # noqa: BLE001
            waiting = 0
        if waiting >= max(1, self.prefetch):
            return 0
        return max(0, self.max_num_seqs + self.prefetch - len(self.active))

    def _intake(self) -> None:
        """Before a step: the cancellations (aborted), then new jobs if there is room (one round trip on Redis
        while nothing is queued: a busy worker asked twice per step before)."""
        cancelled, jobs = self.queue.take_cancellations_and_lease(self.worker_id, self.model, self.room())
        self._cancellations_apply(cancelled)
        self._jobs_add(jobs)

    def _jobs_add(self, jobs: list[Job]) -> None:
        leased_at = time.time()
        for job in jobs:
            self.active[job.request_id] = _Active(job=job, leased_at=leased_at)
            try:
                self._add_to_engine(job)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
                message, param = getattr(exc, "message", str(exc)), getattr(exc, "param", None)
                if param is None and exc.__class__.__name__ != "EngineValidationError":
                    logger.exception("could not start request %s", job.request_id)
                self._fail(job.request_id, f"{message} (param: {param})" if param else str(message), mark=True,
                           error_param=param)

    def _add_to_engine(self, job: Job) -> None:
        from inference.engine import SamplingParams

        sampling = SamplingParams.from_dict(dict(job.sampling))
        self.engine.add_request(
            job.request_id, list(job.prompt_token_ids), sampling, priority=int(job.priority),
            cache_salt=job.cache_salt, prompt_param="messages" if job.endpoint == "chat.completions" else "prompt",
        )

    def _abort_cancelled(self) -> None:
        try:
            cancelled = self.queue.take_cancellations(self.worker_id)
        except Exception:  # noqa: BLE001
            logger.exception("reading cancellations failed")
            return
        self._cancellations_apply(cancelled)

    def _cancellations_apply(self, cancelled: set[str]) -> None:
        for request_id in cancelled:
            if request_id in self.active:
                self.active[request_id].aborting = True
                self._engine_abort(request_id)  # the next step reports it finished with "abort"

    def _end_dropped(self) -> None:
        try:
            dropped = self.queue.take_dropped(self.model)
        except Exception:  # noqa: BLE001
            logger.exception("reading dropped jobs failed")
            return
        for job in dropped:
            job_finish(job=job, sink=self.sink, worker_id=self.worker_id, finish_reason="abort",
                       error="Cancelled before it started.")

    # ------------------------------------------------------------ stepping
    def _step(self) -> None:
        self._step_started = time.monotonic()
        error: Exception | None = None
        marking: list[tuple[list[str], Future]] = []

        def mark_ahead(request_ids: list[str]) -> None:
            """Engine callback, before the model runs: flag these leases started meanwhile."""
            ids = [rid for rid in request_ids if rid in self.active and not self.active[rid].started]
            if ids:
                marking.append((ids, self._marker.submit(self.queue.mark_started, self.worker_id, ids)))

        try:
            outputs = self.engine.step(on_first_tokens=mark_ahead) if self._marker is not None else self.engine.step()
        except Exception as exc:  # noqa: BLE001
            error = exc
        finally:
            self._step_started = None
        for ids, future in marking:
            self._marked_ahead(ids, future)
        if self._reaped_in_step:  # an in-step heartbeat found us reaped: this step's news is not ours to send
            self._reaped_in_step = False
            self._drop_reaped()
            return
        if error is not None:
            logger.error("engine step failed; ending the %d requests it held", len(self.active), exc_info=error)
            for request_id in list(self.active):
                self._engine_abort(request_id)
                self._fail(request_id, f"Engine error: {error}")
            return
        self.steps += 1
        now = time.time()
        first = [o.request_id for o in outputs if o.request_id in self.active and not self.active[o.request_id].started
                 and (o.finished or o.new_token_ids or o.delta_text)]
        if first:  # not flagged during the step (an in-process queue, or that round trip failed)
            owned = self.queue.mark_started(self.worker_id, first)
            for request_id in first:
                self._started_apply(request_id, request_id in owned)
        # One hand-over per step for the deltas, then (by the finisher thread,
        # after the usage records are written) one for the done events: each
        # reply channel gets at most two messages per step, and neither a delta
        # nor the next step waits for a database write. The
        # requests' first tokens lead the deltas: the web process and its
        # clients handle a step's events in order, so a new stream's first
        # token does not wait behind every running stream's next one (paired
        # TTFT overhead at 16 streams 9.9 -> 7.4 ms p50, BENCHMARKS.md).
        # Each request still gets its events in order (one delta per step).
        firsts: list[tuple[str, dict]] = []
        deltas: list[tuple[str, dict]] = []
        finished: list[tuple[_Active, Any]] = []
        for output in outputs:
            active = self.active.get(output.request_id)
            if active is None:
                continue
            try:
                if self._handle_output(active, output, now, deltas, firsts):
                    finished.append((active, output))
            except Exception as exc:  # noqa: BLE001
                logger.exception("handling output of %s failed", output.request_id)
                self._engine_abort(output.request_id)
                self._fail(output.request_id, f"Worker error: {exc}")
        self.sink.send_many(firsts + deltas, wait_s=FIRST_TOKEN_SEND_WAIT_S if firsts else 0.0)
        if getattr(self.engine, "dead", None) and not self.draining:
            logger.critical("worker %s: %s; taking no more work", self.worker_id, self.engine.dead)
            self.request_drain()
        if not finished:
            return
        for active, _output in finished:
            self.active.pop(active.job.request_id, None)  # room for new work at once
        pending = self._finishing
        while pending and pending[0].done():
            pending.popleft()
        if len(pending) >= self.finish_backlog:  # the database is not keeping up: wait, as before the finisher
            pending.popleft().result()
        self._to_finish.extend((active, output, now) for active, output in finished)
        pending.append(self._finisher.submit(self._finish_pending))

    def _finish_pending(self) -> None:
        """(The finisher thread.) Everything the engine finished that no earlier call took: one
        step's requests, or several steps' when the finisher fell behind (it catches up in one insert)."""
        batch = []
        while self._to_finish:
            batch.append(self._to_finish.popleft())
        if batch:
            try:
                self._finish_all(batch)
            except Exception:  # noqa: BLE001 - never an exception left in the future the loop may wait on
                logger.exception("finishing %s failed", [active.job.request_id for active, _o, _n in batch])

    def _finish_all(self, finished: list[tuple[_Active, Any, float]]) -> None:
        """The usage records of `finished` (active, engine output, when), in one insert, then their
        done events, together, then their leases released (one call)."""
        records: list[dict] = []
        dones: list[tuple[str, dict]] = []
        for active, output, now in finished:
            job = active.job
            try:
                record, event = self._ending(active, output, now)
            except Exception as exc:  # noqa: BLE001
                logger.exception("finishing %s failed", job.request_id)
                record, event = job_ending(job=job, worker_id=self.worker_id, finish_reason="error",
                                           error=f"Worker error: {exc}", **active.tokens_so_far())
            records.append(record)
            dones.append((job.reply_channel, event))
        usage_records_safe(records)
        try:
            self.sink.send_many(dones)
        except Exception:  # noqa: BLE001 - the leases are still released
            logger.exception("sending %d done events failed", len(dones))
        ids = [active.job.request_id for active, _output, _now in finished]
        try:
            self.queue.complete_many(self.worker_id, ids)
        except Exception:  # noqa: BLE001 - their leases stay until this worker leaves or is reaped
            logger.exception("completing %s failed", ids)

    def _marked_ahead(self, ids: list[str], future: Future) -> None:
        """The answer to a mark sent during the step (done by now: a step outlasts a round trip)."""
        try:
            owned = future.result()
        except Exception:  # noqa: BLE001 - they are marked after the step instead
            logger.warning("marking %d requests started during the step failed", len(ids), exc_info=True)
            return
        for request_id in ids:
            self._started_apply(request_id, request_id in owned)

    def _started_apply(self, request_id: str, owned: bool) -> None:
        active = self.active.get(request_id)
        if active is None:
            return
        if owned:
            active.started = True
        else:  # reaped meanwhile: someone else owns it now
            self._engine_abort(request_id)
            self.active.pop(request_id, None)

    def _handle_output(self, active: _Active, output: Any, now: float, events: list, firsts: list) -> bool:
        """Append this output's delta to `events` (to `firsts` for a first token); True when it finished."""
        job = active.job
        new_ids = output.new_token_ids
        if new_ids or output.delta_text:
            new_ids = list(new_ids or ())
            first = active.first_token_at is None
            if first:
                active.first_token_at = now
            active.completion_tokens += len(new_ids)
            self._tokens_since_beat += len(new_ids)
            (firsts if first else events).append((job.reply_channel, delta_event(
                request_id=job.request_id, text=output.delta_text or "", token_ids=new_ids, logprobs=output.logprobs)))
        return bool(output.finished)

    def _ending(self, active: _Active, output: Any, now: float) -> tuple[dict, dict]:
        """(usage record fields, done event) of a request the engine finished."""
        job = active.job
        usage, timing = output.usage, output.timing
        engine_queued = float(getattr(timing, "queued_s", 0.0) or 0.0)
        extra = {f"engine_{name}": getattr(timing, name, None) for name in ("queued_s", "ttft_s", "e2e_s")}
        return job_ending(
            job=job, worker_id=self.worker_id,
            finish_reason=output.finish_reason or "stop",
            prompt_tokens=int(usage.prompt_tokens), cached_tokens=int(usage.cached_tokens),
            completion_tokens=int(usage.completion_tokens),
            queued_s=max(0.0, active.leased_at - job.enqueued_at) + engine_queued,
            ttft_s=active.ttft_s, error=getattr(output, "error", None),
            stop_reason=output.stop_reason, extra_timing=extra, now=now,
        )

    # ------------------------------------------------------------ endings
    def _engine_abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:  # noqa: BLE001 - it may never have been added
            logger.debug("abort of %s failed", request_id, exc_info=True)

    def _fail(self, request_id: str, error: str, *, mark: bool = False, error_param: str | None = None) -> None:
        active = self.active.get(request_id)
        if active is None:
            return
        if mark or not active.started:
            if request_id not in self.queue.mark_started(self.worker_id, [request_id]):
                self.active.pop(request_id, None)
                return
        job_fail(job=active.job, sink=self.sink, worker_id=self.worker_id, error=error, error_param=error_param,
                 **active.tokens_so_far())
        self._release(request_id)

    def _end_lost(self, request_id: str) -> None:
        active = self.active.get(request_id)
        if active is None:
            return
        if not active.aborting:
            self._fail(request_id, "The engine lost this request.")
            return
        if not active.started and request_id not in self.queue.mark_started(self.worker_id, [request_id]):
            self.active.pop(request_id, None)
            return
        job_finish(job=active.job, sink=self.sink, worker_id=self.worker_id, finish_reason="abort",
                   ttft_s=active.ttft_s, **active.tokens_so_far())
        self._release(request_id)

    def _release(self, request_id: str) -> None:
        self.active.pop(request_id, None)
        try:
            self.queue.complete(self.worker_id, request_id)
        except Exception:  # noqa: BLE001
            logger.exception("completing %s failed", request_id)

    def shutdown(self) -> None:
        """Leave the queue: anything still held is requeued (unstarted) or failed."""
        self._finisher.submit(_close_db_connections)  # after the finishes handed over: records, events, leases
        self._finisher.shutdown(wait=True)
        for request_id, active in list(self.active.items()):
            self._engine_abort(request_id)
            if active.started:  # end it here, with the tokens it got; unstarted ones are requeued below
                self._fail(request_id, "The worker shut down before finishing this request.")
        self.active.clear()
        try:
            result: ReapResult = self.queue.unregister(self.worker_id)
            reap_result_finish(result=result, sink=self.sink, error="The worker shut down before finishing this request.")
        except Exception:  # noqa: BLE001
            logger.exception("unregistering worker %s failed", self.worker_id)
        self.sink.flush(timeout=5.0)
        if self._marker is not None:
            self._marker.shutdown(wait=False)
        _close_db_connections()
        logger.info("worker %s stopped", self.worker_id)


def _close_db_connections() -> None:
    """Close this thread's database connections (threads never get Django's request signals)."""
    from django.db import connection, connections

    if not connection.in_atomic_block:
        connections.close_all()
