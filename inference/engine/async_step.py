"""Async scheduling's step order (`EngineConfig.async_scheduling`): launch the next step, then read
back the one in flight.

`step()` schedules, prepares and launches step N+1 before reading back the tokens of step N
(`Sequence.pending`: a decode input taken on the device from step N's sampled ids), then takes
those tokens and builds their outputs while step N+1 computes. Part of `Engine` (a mixin: it uses
the engine's scheduler, runner, sampler, timers and token handling).
"""

from __future__ import annotations

import time

from inference.engine.outputs import RequestOutput
from inference.engine.sampler import PendingSample
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import SeqStatus

FINISHED = SeqStatus.FINISHED


class AsyncSchedulingSteps:
    def _step_ahead(self, on_first_tokens) -> list[RequestOutput]:
        outputs, self._pending = self._pending, []
        prev, self._inflight = self._inflight, None
        if prev is not None and self._inflight_needs_host:
            outputs += self._land(prev)  # its rows' sampling needs their latest token on the host
            prev = None
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.timers["schedule_s"] += t1 - t0
        if batch:
            if on_first_tokens is not None:
                batch.notify_first_tokens(on_first_tokens)
            try:
                inputs = self.runner.prepare(batch.seqs, batch.num_new_tokens,
                                             prev.tokens if prev is not None else None)
                t2 = time.perf_counter()
                seqs, logits = self.runner.run(*inputs)
                t3 = time.perf_counter()
                inflight = self.sampler.launch(logits, seqs) if seqs else None
            except Exception as exc:  # noqa: BLE001 - land the step in flight, then rerun this one in parts
                if prev is not None:
                    outputs += self._land(prev)
                live = [(s, n) for s, n in zip(batch.seqs, batch.num_new_tokens) if s.status is not FINISHED]
                return outputs + self._recover(ScheduledBatch([s for s, _ in live], [n for _, n in live]), exc)
            self.scheduler.postprocess(batch)
            if self._failed_steps:
                self._failed_steps = 0
            if seqs:
                self._inflight = inflight
                needs_host = False
                for i, seq in enumerate(seqs):
                    seq.pending += 1
                    seq.pending_row = i
                    sp = seq.sampling
                    needs_host = needs_host or sp.logprobs is not None or sp.has_penalties
                self._inflight_needs_host = needs_host
            t4 = time.perf_counter()
            self.timers["prepare_s"] += t2 - t1
            self.timers["model_s"] += t3 - t2
            self.timers["sample_s"] += t4 - t3
            self._count(batch, len(seqs), time.time())
        if prev is not None:
            outputs += self._land(prev)  # while the step just launched computes
        return outputs

    def _land(self, pending: PendingSample) -> list[RequestOutput]:
        """Read back a launched step's tokens, take them and build their outputs. A row whose request
        finished since the launch (a stop found in the step before, an abort) is dropped."""
        t0 = time.perf_counter()
        try:
            sampled = self.sampler.finish(pending)
        except Exception as exc:  # noqa: BLE001 - reading back a launched step fails only on a broken device
            for seq in pending.seqs:
                seq.pending -= 1
            return self._die(exc)
        t1 = time.perf_counter()
        now = time.time()
        taken = []
        outputs: list[RequestOutput] = []
        bm = self.block_manager
        bs = bm.block_size if bm.enable_prefix_caching else 0
        token_ids, lps, take = sampled.token_ids, sampled.logprobs, self._take_token
        for i, seq in enumerate(pending.seqs):
            seq.pending -= 1
            if seq.status is FINISHED:
                continue
            try:
                taken.append(take(seq, token_ids[i], None if lps is None else lps[i], now))
            except Exception as exc:  # noqa: BLE001 - this sequence's own failure ends it alone
                outputs.append(self._fail_seq(seq, exc))
                continue
            if bs and len(seq.token_ids) % bs == 0 and not seq.is_finished:
                bm.cache_full_blocks(seq)  # a block completed by this token, computed before it was known
        t2 = time.perf_counter()
        outputs += self._emit_all(taken, now)
        self.timers["sample_s"] += t1 - t0
        self.timers["take_s"] += t2 - t1
        self.timers["output_s"] += time.perf_counter() - t2
        return outputs
