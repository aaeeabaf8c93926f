"""The worker loop: queue -> Engine.step() -> reply channels, one request at a time ended once.

    loop = WorkerLoop(queue=q, model="smollm2-135m-instruct", engine_factory=make_engine, sink=EventSink())
    loop.run()            # until request_drain() (SIGTERM) has finished the work in hand

Each pass: heartbeat (every ~1 s: inference.worker.heartbeat), reap dead
workers (every few seconds), abort the jobs of reply channels nobody reads
(every ~1 s: inference.worker.listeners), abort what clients cancelled, end jobs dropped
from the queue, lease new jobs when the engine has room, then one engine step
whose outputs become `Delta` events (inference.protocol) and, for finished
requests, a usage record and one `Done`, both from the finisher thread
(inference.worker.ending_thread). An error in one request ends that request with
finish_reason "error" (the engine pins a failing step to the requests that
made it fail); an error the engine lets through ends every request in the
engine; neither stops the loop. An engine that declares itself dead (a broken
device: every request failed alone) has ended its requests once: the loop
stops taking work and returns once the requests in hand are finished.

Room (how many jobs it leases) and the intake interval it reports to routing:
inference.worker.intake.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from common.outage import Outage, connection_lost
from inference.engine.sampling_params import EngineValidationError, SamplingParams
from inference.metrics.engine_stats import EngineMetrics
from inference.metrics.live import process_figures_update
from inference.metrics.timeline import worker_sample
from inference.protocol import Delta
from inference.queue import Job, JobQueue, ReapResult

from .events import EventSink
from .endings import RequestEndings
from .finish import ActiveRequest, db_connections_close, endings_spool
from .ending_thread import Finisher
from .heartbeat import Heartbeats, WorkerFigures
from .intake import IntakeClock, intake_room
from .listeners import ReplyWatch
from .marks import StartMarks
from .reaper import dead_workers_reap, dropped_jobs_finish, reap_result_finish
from .serving_engine import ServingEngine
from .spool import spool_close

logger = logging.getLogger(__name__)

# A step that carries first tokens waits (at most this long) until its events are sent, so the
# sending thread need not wait for the GIL through the next step's Python (EventSink.send_many).
FIRST_TOKEN_SEND_WAIT_S = 0.002


def default_worker_id(model: str) -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{model}:{os.urandom(3).hex()}"


class WorkerLoop:
    def __init__(
        self,
        *,
        queue: JobQueue,
        model: str,
        sink: EventSink,
        engine: ServingEngine | None = None,
        engine_factory: Callable[[], ServingEngine] | None = None,
        worker_id: str | None = None,
        device: str = "cpu",
        max_num_seqs: int | None = None,
        prefetch: int | None = None,
        heartbeat_interval: float = 1.0,
        reap_interval: float | None = None,
        dropped_interval: float = 0.2,
        reply_alive_timeout: float = 3.0,
    ) -> None:
        if engine is None and engine_factory is None:
            raise ValueError("WorkerLoop needs an engine or an engine_factory")
        self.queue = queue
        self.model = model
        self.sink = sink
        self.engine: ServingEngine | None = engine
        self.engine_factory = engine_factory
        self.worker_id = worker_id or default_worker_id(model)
        self.device = device
        self._max_num_seqs = max_num_seqs
        self._prefetch = prefetch
        self.reap_interval = reap_interval if reap_interval is not None else max(1.0, queue.heartbeat_timeout / 2)
        self.dropped_interval = dropped_interval
        self.reply_watch = ReplyWatch(replies=queue.replies, timeout=reply_alive_timeout)
        self.queue_outage = Outage(logger, f"worker {self.worker_id}: job queue (Redis)")
        self.active: dict[str, ActiveRequest] = {}
        self.started_at = time.time()
        self.steps = 0
        self._draining = threading.Event()
        self._stopping = threading.Event()
        self._next_reap = 0.0
        self._next_dropped = 0.0
        self.intake_clock = IntakeClock()  # how often this worker comes for work while busy (queue.routing)
        self.heartbeats = Heartbeats(registry=queue.workers, worker_id=self.worker_id, model=model, figures=self.figures,
                                     interval=heartbeat_interval)
        self.endings = RequestEndings(queue=queue, sink=sink, worker_id=self.worker_id, active=self.active)
        self.marks = StartMarks(queue=queue, worker_id=self.worker_id)
        self.finisher = Finisher(queue=queue, sink=sink, worker_id=self.worker_id)
        self.metrics = EngineMetrics(model=model)

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
        try:
            self.load_engine()
            try:
                endings_spool()  # takes over the usage records a dead worker left in the spool folder
            except Exception:  # noqa: BLE001 - the records wait there for the next worker
                logger.exception("could not open the usage-record spool")
            self.heartbeats.start()
            while not self._stopping.is_set():
                try:
                    self.run_once()
                    failures = 0
                    self.queue_outage.ok()
                except Exception as exc:  # noqa: BLE001 - e.g. Redis unreachable for a moment
                    failures += 1
                    if connection_lost(exc):  # said once per outage, not a traceback per pass
                        self.queue_outage.failed(repr(exc))
                    else:
                        logger.exception("worker loop pass failed (%d in a row); retrying", failures)
                    time.sleep(min(1.0, 0.05 * 2**failures))
                if self.draining and not self.active:
                    break
        finally:
            self.heartbeats.stop()
            self.shutdown()

    def load_engine(self) -> None:
        """Build the engine (if a factory was given), heartbeating while it loads."""
        if self.engine is not None:
            return
        with self.heartbeats.while_loading():
            self.engine = self.engine_factory()
        logger.info("worker %s: engine for %s loaded on %s", self.worker_id, self.model, self.device)

    def run_once(self) -> None:
        now = time.monotonic()
        if self.heartbeats.due(now):
            self.heartbeat()
        if now >= self._next_reap:
            self._next_reap = now + self.reap_interval
            try:
                dead_workers_reap(queue=self.queue, sink=self.sink)
            except Exception as exc:  # noqa: BLE001
                if not connection_lost(exc):
                    logger.exception("reaping failed")
        if now >= self.reply_watch.next_at and self.active:
            self._abort_unheard(now)
        if now >= self._next_dropped:
            self._next_dropped = now + self.dropped_interval
            dropped_jobs_finish(queue=self.queue, sink=self.sink, model=self.model, worker_id=self.worker_id)
        if self.draining:
            self._abort_cancelled()
        else:
            self._intake()
        if self.active or self.engine.has_unfinished():
            self._step()
            self.intake_clock.stepped()
            if self.active and not self.engine.has_unfinished():
                # The engine holds nothing, yet these never finished: end them here.
                for request_id in list(self.active):
                    self.endings.end_lost(request_id)
        elif not self.draining:
            # Enqueues, cancellations of queued jobs and requeues all wake this wait.
            wait = min(self.heartbeats.next_at - time.monotonic(), self.heartbeats.interval)
            if self.queue.wait_for_work(self.model, timeout=max(wait, 0.01), worker_id=self.worker_id):
                self._next_dropped = 0.0

    # ------------------------------------------------------------ heartbeats
    def figures(self) -> WorkerFigures:
        """What this worker's heartbeats report of it (inference.worker.heartbeat)."""
        return WorkerFigures(device=self.device, started_at=self.started_at, draining=self.draining,
                             active=len(self.active), max_num_seqs=self._max_num_seqs, steps=self.steps,
                             engine=self.engine)

    def heartbeat(self) -> None:
        """Beat, then update the metrics from the engine figures the beat reported (inference.metrics)."""
        alive = self.heartbeats.beat()
        self.metrics.update(self.heartbeats.engine_stats, active=len(self.active))
        worker_sample(queue=self.queue, worker_id=self.worker_id, model=self.model,
                      engine_stats=self.heartbeats.engine_stats, tok_s=self.heartbeats.tok_s)  # the console's hour
        process_figures_update()
        if not alive:
            self._drop_reaped()

    def _engine_abort(self, request_id: str) -> None:
        try:
            self.engine.abort(request_id)
        except Exception:  # noqa: BLE001 - it may never have been added
            logger.debug("abort of %s failed", request_id, exc_info=True)

    def _drop_reaped(self) -> None:
        """We were reaped (too slow to heartbeat): our jobs were requeued or failed elsewhere.
        Drop them without sending anything more."""
        logger.error("worker %s was reaped; dropping %d requests", self.worker_id, len(self.active))
        for request_id in list(self.active):
            self._engine_abort(request_id)
        self.active.clear()

    # ------------------------------------------------------------ intake
    def room(self) -> int:
        return intake_room(self.engine, len(self.active), self.max_num_seqs, self.prefetch)

    def _intake(self) -> None:
        """Before a step: the cancellations (aborted), then new jobs if there is room (one round trip on Redis
        while nothing is queued: a busy worker asked twice per step before)."""
        cancelled, jobs = self.queue.take_cancellations_and_lease(self.worker_id, self.model, self.room(),
                                                                  intake_every_s=self.intake_clock.intake())
        self._cancellations_apply(cancelled)
        self._jobs_add(jobs)

    def _jobs_add(self, jobs: list[Job]) -> None:
        leased_at = time.time()
        for job in jobs:
            self.active[job.request_id] = ActiveRequest(job=job, leased_at=leased_at)
            try:
                self._add_to_engine(job)
            except EngineValidationError as exc:  # the client's fault: the web answers 400 for `param`
                self.endings.fail(job.request_id, exc.message, mark=True, error_param=exc.param)
            except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
                logger.exception("could not start request %s", job.request_id)
                self.endings.fail(job.request_id, str(exc), mark=True)

    def _add_to_engine(self, job: Job) -> None:
        sampling = SamplingParams.from_dict(dict(job.sampling))
        self.engine.add_request(job.request_id, list(job.prompt_token_ids), sampling, priority=int(job.priority),
                                cache_salt=job.cache_salt)

    def _abort_cancelled(self) -> None:
        try:
            cancelled = self.queue.take_cancellations(self.worker_id)
        except Exception:  # noqa: BLE001
            logger.exception("reading cancellations failed")
            return
        self._cancellations_apply(cancelled)

    def _abort_unheard(self, now: float) -> None:
        """Abort the jobs of reply channels nobody reads any more (inference.worker.listeners): they end
        with "abort", billed for what they generated."""
        dead, ids = self.reply_watch.unheard(self.active, now)
        if ids:
            logger.warning("worker %s: nobody reads %s any more; aborting %d requests", self.worker_id,
                           ", ".join(sorted(dead)), len(ids))
            self._cancellations_apply(ids)

    def _cancellations_apply(self, cancelled: set[str]) -> None:
        for request_id in cancelled:
            if request_id in self.active:
                self.active[request_id].aborting = True
                self._engine_abort(request_id)  # the next step reports it finished with "abort"

    # ------------------------------------------------------------ stepping
    def _step(self) -> None:
        self.heartbeats.step_started()
        error: Exception | None = None
        mark_ahead = self.marks.callback(self.active)
        try:
            outputs = self.engine.step(on_first_tokens=mark_ahead) if mark_ahead is not None else self.engine.step()
        except Exception as exc:  # noqa: BLE001
            error = exc
        finally:
            reaped = self.heartbeats.step_ended()
        for request_id, owned in self.marks.answers():
            self._started_apply(request_id, owned)
        if reaped:  # an in-step heartbeat found us reaped: this step's news is not ours to send
            self._drop_reaped()
            return
        if error is not None:
            logger.error("engine step failed; ending the %d requests it held", len(self.active), exc_info=error)
            for request_id in list(self.active):
                self._engine_abort(request_id)
                self.endings.fail(request_id, f"Engine error: {error}")
            return
        self.steps += 1
        now = time.time()
        first = [o.request_id for o in outputs if o.request_id in self.active and not self.active[o.request_id].started
                 and (o.finished or o.new_token_ids or o.delta_text)]
        if first:  # not flagged during the step (an in-process queue, or that round trip failed)
            owned = self.queue.mark_started(self.worker_id, first)
            for request_id in first:
                self._started_apply(request_id, request_id in owned)
        # One hand-over per step for the deltas, then (by the finisher thread, after the usage records are
        # written) one for the done events: each reply channel gets at most two messages per step, and
        # neither a delta nor the next step waits for a database write. The requests' first tokens lead the
        # deltas: the web handles a step's events in order, so a new stream's first token does not wait
        # behind every running stream's next one. Each request still gets its events in order.
        firsts: list[tuple[str, Delta]] = []
        deltas: list[tuple[str, Delta]] = []
        finished: list[tuple[ActiveRequest, Any]] = []
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
                self.endings.fail(output.request_id, f"Worker error: {exc}")
        self.sink.send_many(firsts + deltas, wait_s=FIRST_TOKEN_SEND_WAIT_S if firsts else 0.0)
        if getattr(self.engine, "dead", None) and not self.draining:
            logger.critical("worker %s: %s; taking no more work", self.worker_id, self.engine.dead)
            self.request_drain()
        if not finished:
            return
        for active, _output in finished:
            self.active.pop(active.job.request_id, None)  # room for new work at once
        self.finisher.submit(finished, now)

    def _started_apply(self, request_id: str, owned: bool) -> None:
        active = self.active.get(request_id)
        if active is None:
            return
        if owned:
            active.started = True
        else:  # reaped meanwhile: someone else owns it now
            self._engine_abort(request_id)
            self.active.pop(request_id, None)

    def _handle_output(self, active: ActiveRequest, output: Any, now: float, events: list, firsts: list) -> bool:
        """Append this output's delta to `events` (to `firsts` for a first token); True when it finished."""
        job = active.job
        new_ids = output.new_token_ids
        if new_ids or output.delta_text:
            new_ids = list(new_ids or ())
            first = active.first_token_at is None
            if first:
                active.first_token_at = now
            active.completion_tokens += len(new_ids)
            self.heartbeats.tokens_add(len(new_ids))
            delta = Delta(job.request_id, output.delta_text or "", new_ids, output.logprobs, seq=active.seq_take())
            if first:
                delta.system_fingerprint = getattr(self.engine, "system_fingerprint", None)
            (firsts if first else events).append((job.reply_channel, delta))
        return bool(output.finished)

    def shutdown(self) -> None:
        """Leave the queue: anything still held is requeued (unstarted) or failed."""
        self.finisher.close(then=db_connections_close)  # after the finishes handed over: records, events, leases
        for request_id, active in list(self.active.items()):
            self._engine_abort(request_id)
            if active.started:  # end it here, with the tokens it got; unstarted ones are requeued below
                self.endings.fail(request_id, "The worker shut down before finishing this request.")
        self.active.clear()
        try:
            result: ReapResult = self.queue.unregister(self.worker_id)
            reap_result_finish(result=result, sink=self.sink, error="The worker shut down before finishing this request.")
        except Exception:  # noqa: BLE001
            logger.exception("unregistering worker %s failed", self.worker_id)
        self.sink.flush(timeout=5.0)
        self.marks.close()
        spool_close(flush_timeout=5.0)  # what the database could not take yet stays on disk for the next worker
        db_connections_close()
        logger.info("worker %s stopped", self.worker_id)

