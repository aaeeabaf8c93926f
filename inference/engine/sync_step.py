"""The synchronous step order (`EngineConfig.async_scheduling` off): schedule, run the model, sample,
read the tokens back, take them; then build their outputs, at once or (`async_output`) during the
next step, while the GPU runs it.

With async_output a step appends its tokens and decides stop tokens and length limits at once, and
keeps the rest (`deferred`: text deltas, stop strings, RequestOutputs) for the next `step()`, which
returns them. A stop string found that late finishes its request one step after its token; the
token computed meanwhile for it is dropped.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from inference.engine.model_runner import ModelRunner
from inference.engine.outputs import RequestOutput
from inference.engine.sampler import Sampler
from inference.engine.scheduler import ScheduledBatch, Scheduler
from inference.engine.spec_step import SpecSampling, drafting
from inference.engine.step_isolation import StepFailureHandler
from inference.engine.step_meter import StepMeter
from inference.engine.token_outputs import Taken, TokenOutputs, taken_seq


class SyncStepOrder:
    """One step at a time: `scheduler` batches, `runner` computes, `sampler` samples, `tokens` takes
    and emits, `failures` handles a step that raises, `meter` counts and times."""

    def __init__(self, *, scheduler: Scheduler, runner: ModelRunner, sampler: Sampler, tokens: TokenOutputs,
                 failures: StepFailureHandler, meter: StepMeter, async_output: bool,
                 spec: SpecSampling | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.sampler = sampler
        self.tokens = tokens
        self.failures = failures
        self.meter = meter
        self.async_output = async_output
        self.spec = spec  # speculative decoding: a step with drafts samples through it (inference.engine.spec_step)
        self.deferred: list[Taken] = []  # async_output: the last step's taken tokens, awaiting their outputs

    def holds_work(self) -> bool:
        """Outputs still to come from a step that ran (async_output)."""
        return bool(self.deferred)

    def step(self, outputs: list[RequestOutput],
             on_first_tokens: Callable[[list[str]], None] | None) -> list[RequestOutput]:
        """One step; its outputs (or, with async_output, the previous step's) appended to `outputs`."""
        timers = self.meter.timers
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        t1 = time.perf_counter()
        timers["schedule_s"] += t1 - t0
        if not batch:
            if self.deferred:
                outputs += self._emit_deferred()
                timers["output_s"] += time.perf_counter() - t1
            return outputs
        if on_first_tokens is not None:
            batch.notify_first_tokens(on_first_tokens)
        return self._run(batch, outputs, t1)

    def _run(self, batch: ScheduledBatch, outputs: list[RequestOutput], t1: float) -> list[RequestOutput]:
        """Run the scheduled `batch` (scheduled by `t1`): forward, sampling, its tokens taken."""
        spec = self.spec if self.spec is not None and drafting(batch) else None
        try:
            inputs = self.runner.prepare(batch.seqs, batch.num_new_tokens)
            t1b = time.perf_counter()
            seqs, logits = self.runner.run(*inputs)
            t2 = time.perf_counter()
            pending = (spec or self.sampler).launch(logits, seqs) if seqs else None
        except Exception as exc:  # noqa: BLE001 - pinned to its request(s) below
            return outputs + self._emit_deferred() + self.failures.recover(batch, exc)
        self.scheduler.postprocess(batch)
        t2b = time.perf_counter()
        if self.async_output:
            outputs += self._emit_deferred()  # the previous step's outputs, while the GPU works
        t2c = time.perf_counter()
        try:  # reading the tokens back: a failure here reruns the step
            sampled = (spec or self.sampler).finish(pending) if pending is not None else None
        except Exception as exc:  # noqa: BLE001
            for seq, n in zip(batch.seqs, batch.num_new_tokens):  # undo postprocess: the step is rerun
                seq.num_computed_tokens -= n
            return outputs + self.failures.recover(batch, exc)
        t3 = time.perf_counter()
        now = time.time()
        taken, generated = [], len(seqs)
        if sampled is None:
            pass
        elif spec is not None:
            taken, generated = spec.take(sampled, now, outputs)
        else:
            taken = self.tokens.take_all(seqs, sampled.token_ids, sampled.logprobs, now, outputs)
        t3b = time.perf_counter()
        if self.async_output:
            self.deferred = taken
        else:
            outputs += self.tokens.emit_all(taken, now)
        self.failures.step_ran()
        t4 = time.perf_counter()
        timers = self.meter.timers
        timers["sample_s"] += (t2b - t2) + (t3 - t2c)
        timers["take_s"] += t3b - t3
        timers["output_s"] += (t2c - t2b) + (t4 - t3b)
        timers["prepare_s"] += t1b - t1
        timers["model_s"] += t2 - t1b
        self.meter.count(batch, len(seqs), now, generated=generated)
        return outputs

    def _emit_deferred(self) -> list[RequestOutput]:
        """The previous step's outputs (async_output)."""
        deferred, self.deferred = self.deferred, []
        # aborted since: its abort notice is the last word
        return self.tokens.emit_all([taken for taken in deferred if taken_seq(taken).finish_reason != "abort"],
                                    time.time())
