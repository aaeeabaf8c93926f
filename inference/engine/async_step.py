"""Async scheduling's step order (`EngineConfig.async_scheduling`): launch the next step, then read
back the one in flight.

`step()` schedules, prepares and launches step N+1 before reading back the tokens of step N
(`Sequence.pending`: a decode input taken on the device from step N's sampled ids), then takes
those tokens and builds their outputs while step N+1 computes. A request that finishes (stop
token, stop string) has had one more step launched for it; that step's token is dropped. Rows that
need their history on the host (penalties, logprobs) read the step back first.

A row with a grammar (structured output) needs its matcher advanced by its pending token before its
next mask: a batch holding one launches its forward, lands the step in flight (the matchers take its
tokens), and only then samples (`unsampled`), so the forward still overlaps the landing on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inference.engine.block_manager import BlockManager
from inference.engine.model_runner import ModelRunner
from inference.engine.outputs import RequestOutput
from inference.engine.sampler import PendingSample, Sampler
from inference.engine.scheduler import ScheduledBatch, Scheduler
from inference.engine.sequence import SeqStatus
from inference.engine.step_isolation import StepFailureHandler
from inference.engine.step_meter import StepMeter
from inference.engine.token_outputs import TokenOutputs

FINISHED = SeqStatus.FINISHED


class AsyncSchedulingOrder:
    """Steps launched one ahead: `scheduler` batches, `runner` computes, `sampler` samples (on the
    device, read back a step later), `tokens` takes and emits, `block_manager` caches the blocks a
    late token completes, `failures` handles a step that raises, `meter` counts and times."""

    def __init__(self, *, scheduler: Scheduler, block_manager: BlockManager, runner: ModelRunner,
                 sampler: Sampler, tokens: TokenOutputs, failures: StepFailureHandler, meter: StepMeter) -> None:
        self.scheduler = scheduler
        self.block_manager = block_manager
        self.runner = runner
        self.sampler = sampler
        self.tokens = tokens
        self.failures = failures
        self.meter = meter
        # the launched step whose tokens are not read back yet, and whether the next schedule must wait
        # for them (a row whose sampling reads its token history on the host)
        self.inflight: PendingSample | None = None
        self.inflight_needs_host = False
        # a launched forward whose sampling waits for the step in flight to land (rows with a grammar):
        # (batch, logits, sampled seqs)
        self.unsampled: tuple[ScheduledBatch, object, list] | None = None

    def holds_work(self) -> bool:
        """A launched step not read back yet."""
        return self.inflight is not None

    def step(self, outputs: list[RequestOutput],
             on_first_tokens: Callable[[list[str]], None] | None) -> list[RequestOutput]:
        """Launch the next step, then land the one in flight; their outputs appended to `outputs`."""
        prev, self.inflight = self.inflight, None
        if prev is not None and self.inflight_needs_host:
            outputs += self._land(prev)  # its rows' sampling needs their latest token on the host
            prev = None
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.meter.timers["schedule_s"] += t1 - t0
        if batch:
            if on_first_tokens is not None:
                batch.notify_first_tokens(on_first_tokens)
            recovered = self._launch(batch, prev, t1)
            if recovered is not None:
                return outputs + recovered
        if prev is not None:
            outputs += self._land(prev)  # while the step just launched computes
        if self.unsampled is not None:
            outputs += self._sample_unsampled()
        return outputs

    def _launch(self, batch: ScheduledBatch, prev: PendingSample | None, t1: float) -> list[RequestOutput] | None:
        """Prepare and launch `batch` (scheduled by `t1`), its decode inputs taken from `prev`'s tokens on
        the device. None once launched; if it raised, the outputs of landing `prev` and of rerunning
        `batch` in parts (the step is over)."""
        try:
            inputs = self.runner.prepare(batch.seqs, batch.num_new_tokens, prev.tokens if prev is not None else None)
            t2 = time.perf_counter()
            seqs, logits = self.runner.run(*inputs)
            t3 = time.perf_counter()
            # grammar rows: their masks need the tokens of `prev`, taken after it lands (step())
            defer = prev is not None and any(s.grammar is not None for s in seqs)
            inflight = self.sampler.launch(logits, seqs) if seqs and not defer else None
        except Exception as exc:  # noqa: BLE001 - land the step in flight, then rerun this one in parts
            outputs = self._land(prev) if prev is not None else []
            live = [(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens) if s.status is not FINISHED]
            return outputs + self.failures.recover(ScheduledBatch([s for s, _ in live], [n for _, n in live]), exc)
        self.scheduler.postprocess(batch)
        self.failures.step_ran()
        if seqs:
            self.inflight = inflight
            if defer:
                self.unsampled = (batch, logits, seqs)
            needs_host = False
            for i, seq in enumerate(seqs):
                seq.pending += 1
                seq.pending_row = i
                sp = seq.sampling
                needs_host = needs_host or sp.logprobs is not None or sp.has_penalties
            self.inflight_needs_host = needs_host
        t4 = time.perf_counter()
        timers = self.meter.timers
        timers["prepare_s"] += t2 - t1
        timers["model_s"] += t3 - t2
        timers["sample_s"] += t4 - t3
        self.meter.count(batch, len(seqs), time.time())
        return None

    def _sample_unsampled(self) -> list[RequestOutput]:
        """Sample the launched forward held for its grammar rows, now that their matchers took the tokens
        of the step before. If the sampling raises, the step is undone and rerun in parts, as in the
        synchronous order."""
        batch, logits, seqs = self.unsampled
        self.unsampled = None
        if self.failures.dead is not None:  # landing the step before found a broken device
            return []
        t0 = time.perf_counter()
        try:
            self.inflight = self.sampler.launch(logits, seqs)
        except Exception as exc:  # noqa: BLE001 - pinned to its request(s) by the rerun
            for seq in seqs:
                seq.pending -= 1
            live = [(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens) if s.status is not FINISHED]
            for seq, n in live:
                seq.num_computed_tokens -= n
            self.inflight_needs_host = False
            return self.failures.recover(ScheduledBatch([s for s, _ in live], [n for _, n in live]), exc)
        self.meter.timers["sample_s"] += time.perf_counter() - t0
        return []

    def _land(self, pending: PendingSample) -> list[RequestOutput]:
        """Read back a launched step's tokens, take them and build their outputs. A row whose request
        finished since the launch (a stop found in the step before, an abort) is dropped."""
        t0 = time.perf_counter()
        try:
            sampled = self.sampler.finish(pending)
        except Exception as exc:  # noqa: BLE001 - reading back a launched step fails only on a broken device
            for seq in pending.seqs:
                seq.pending -= 1
            outputs = self.failures.die(exc)
            self.inflight = None  # the engine is dead: the step launched meanwhile is never landed
            return outputs
        t1 = time.perf_counter()
        now = time.time()
        taken = []
        outputs: list[RequestOutput] = []
        bm = self.block_manager
        bs = bm.block_size if bm.enable_prefix_caching else 0
        tokens = self.tokens
        token_ids, lps, take = sampled.token_ids, sampled.logprobs, tokens.take
        for i, seq in enumerate(pending.seqs):
            seq.pending -= 1
            if seq.status is FINISHED:
                continue
            try:
                taken.append(take(seq, token_ids[i], None if lps is None else lps[i], now))
            except Exception as exc:  # noqa: BLE001 - this sequence's own failure ends it alone
                outputs.append(tokens.fail(seq, exc))
                continue
            if bs and len(seq.token_ids) % bs == 0 and not seq.is_finished:
                bm.cache_full_blocks(seq)  # a block completed by this token, computed before it was known
        t2 = time.perf_counter()
        outputs += tokens.emit_all(taken, now)
        timers = self.meter.timers
        timers["sample_s"] += t1 - t0
        timers["take_s"] += t2 - t1
        timers["output_s"] += time.perf_counter() - t2
        return outputs
