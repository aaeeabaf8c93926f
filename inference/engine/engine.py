"""The engine: requests in, per-step outputs out.

    engine = Engine(EngineConfig(model="smollm2-135m-instruct"))
    engine.add_request("r1", prompt_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished():
        for out in engine.step(): ...

One `step()` schedules a batch (scheduler + block manager), runs the model on
it (model runner), samples the rows that are due (sampler) and turns the new
tokens into text deltas and stop decisions (detokenizer + stop checker).

With `async_output` (the default on CUDA) the host work that the next step does
not need is deferred so that it overlaps the GPU: a step appends its tokens and
decides stop tokens and length limits at once, then builds their text deltas,
stop-string matches and RequestOutputs while the GPU runs the next step, whose
`step()` call returns them. A stop string found that late finishes its request
one step after its token; the token computed meanwhile for it is dropped (never
emitted, never counted). Outputs are the same as without it, one step later.

With `async_scheduling` (the CUDA default; implies deferred outputs) the host
work between two forwards leaves the critical path too: `step()` schedules,
prepares and launches the next step before reading back the tokens of the one
in flight (`Sequence.pending`: a decode input taken on the device from that
step's sampled ids), then takes those tokens and builds their outputs while the
new step computes. A request that finishes (stop token, stop string) has had
one more step launched for it; that step's token is dropped as above. Rows that
need their history on the host (penalties, logprobs) read the step back first.
Not thread-safe: one thread drives an engine.

A step that raises ends only the requests that made it fail
(`inference.engine.step_isolation`: the batch is bisected and rerun): they
finish with "error" and their blocks are freed, the others go on. A failure in
one sequence's own token handling (stop checks, detokenizing) ends that
sequence alone. When a step fails for every part of its batch (two requests or
more, or three steps in a row with nothing run in between), the device is taken
to be broken: every request ends with "error" once and the engine is `dead`
(`add_request` raises EngineDeadError), so that a worker stops taking work.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable

import torch

from kernels.dispatch import get_ops

from inference.engine.async_step import AsyncSchedulingSteps
from inference.engine.block_manager import BlockManager
from inference.engine.config import EngineConfig, resolve_step_order
from inference.engine.detokenizer import detokenizer_for
from inference.engine.fingerprint import system_fingerprint
from inference.engine.logprobs import LogprobFormatter
from inference.engine.model_runner import ModelRunner
from inference.engine.outputs import RequestOutput, Timing, Usage
from inference.engine.sampler import PendingSample, Sampler
from inference.engine.sampling_params import EngineValidationError, PromptTooLongError, SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.scheduler_policy import PriorityPolicy
from inference.engine.sequence import Sequence, SeqStatus
from inference.engine.step_isolation import EngineDeadError, StepFailures
from inference.engine.stop_checker import StopChecker

logger = logging.getLogger(__name__)

_RATE_WINDOW_S = 10.0
FINISHED = SeqStatus.FINISHED


class Engine(StepFailures, AsyncSchedulingSteps):
    def __init__(self, config: EngineConfig, *, loaded=None) -> None:
        """`loaded`: an already loaded model (inference.engine.loader.LoadedModel) to share
        weights between engines, e.g. in tests; it must match config.model/dtype/device."""
        from inference.engine.kv_sizing import engine_free_bytes, engine_kv_plan, weights_bytes
        from inference.engine.loader import load_model

        self.config = config
        if config.num_threads is not None and config.device == "cpu":
            torch.set_num_threads(config.num_threads)
        self.device = torch.device(config.device)
        dtype = config.torch_dtype
        free_bytes = engine_free_bytes(config, self.device)  # before the weights load (inference.engine.kv_sizing)
        own_weights = 0  # weights loaded by someone else are already out of free_bytes
        if loaded is None:
            loaded = load_model(config.model, dtype=dtype, device=self.device)
            own_weights = weights_bytes(loaded.model)
        elif loaded.dtype != dtype:
            raise ValueError(f"the loaded model is {loaded.dtype}, the config asks for {dtype}")
        self.loaded = loaded
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.config.vocab_size
        self.max_model_len = min(config.max_model_len or loaded.max_model_len, loaded.config.max_position_embeddings)
        self.kv_plan = engine_kv_plan(config, loaded.config, device=self.device, dtype=dtype,
                                      max_model_len=self.max_model_len, free_bytes=free_bytes, weights=own_weights)
        num_blocks = self.kv_plan.num_blocks
        logger.info("%s on %s: KV cache %s", config.model, self.device, self.kv_plan.describe())
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            policy=PriorityPolicy(aging_s=config.priority_aging_s, max_preemptions=config.max_preemptions),
        )
        self.runner = ModelRunner(loaded.model, loaded.config, num_blocks=num_blocks,
                                  block_size=config.block_size, dtype=dtype, device=self.device,
                                  max_num_seqs=config.max_num_seqs, max_model_len=self.max_model_len,
                                  cuda_graphs=config.cuda_graphs, batch_invariant=config.batch_invariant,
                                  prefill_graphs=config.prefill_graphs,
                                  max_num_batched_tokens=config.max_num_batched_tokens,
                                  fp8_weights=config.fp8_weights, fp8_lm_head=config.fp8_lm_head)
        # what decides this engine's tokens, hashed (OpenAI's system_fingerprint; inference.engine.fingerprint)
        self.system_fingerprint = system_fingerprint(weights=loaded.source.path, dtype=dtype, device=self.device,
                                                     backend=get_ops(self.device).backend
                                                     + "+fp8" * config.fp8_weights + "+fp8_head" * config.fp8_lm_head,
                                                     batch_invariant=config.batch_invariant)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.sampler = Sampler(eos_token_id=self.eos_token_id, seed=config.seed, per_row=config.batch_invariant)
        self.logprob_formatter = LogprobFormatter(self.tokenizer)
        if self.tokenizer.byte_level:
            self.tokenizer.token_text_table()  # now, not in the first request's step (detokenizer, logprobs)
        self._pending: list[RequestOutput] = []  # abort notices for the next step()
        # async_output: (seq, token, sampled logprobs, output count, stopped by a stop token) awaiting their outputs
        self._deferred: list[tuple] = []
        self.async_output, self.async_scheduling = resolve_step_order(
            self.device.type, config.async_output, config.async_scheduling)
        # async_scheduling: the launched step whose tokens are not read back yet, and whether the next
        # schedule must wait for them (a row whose sampling reads its token history on the host)
        self._inflight: PendingSample | None = None
        self._inflight_needs_host = False
        self._ids = itertools.count()
        self.dead: str | None = None  # why the engine stopped taking requests (a broken device), if it did
        self._failed_steps = 0  # steps in a row whose every scheduled request failed alone
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, prompt tokens, generated tokens)
        self.counters = {"steps": 0, "prompt_tokens": 0, "generated_tokens": 0}
        # Wall time per phase of step(); everything but model_s is engine overhead. take_s: appending the
        # sampled tokens and their stop-token / length checks (what the next schedule needs: with
        # async_output on a GPU, host time between two forwards, with schedule_s and prepare_s);
        # output_s: text deltas, stop strings, RequestOutputs (async_output: while the GPU runs).
        self.timers = {"schedule_s": 0.0, "prepare_s": 0.0, "model_s": 0.0, "sample_s": 0.0, "take_s": 0.0,
                       "output_s": 0.0}

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], sampling: SamplingParams,
                    priority: int = 0, cache_salt: str | None = None, arrival_time: float | None = None) -> None:
        """Validate and queue a request. Raises EngineValidationError (`param`: the request parameter at
        fault), PromptTooLongError when the prompt and its completion do not fit; EngineDeadError once
        the engine is dead."""
        if self.dead is not None:
            raise EngineDeadError(self.dead)
        sampling.validate(vocab_size=self.vocab_size)
        n = len(prompt_token_ids)
        if n == 0:
            raise EngineValidationError("The prompt must contain at least one token.", "prompt")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt_token_ids):
            raise EngineValidationError("The prompt contains an invalid token id.", "prompt")
        max_tokens = sampling.max_tokens if sampling.max_tokens is not None else self.max_model_len - n
        if max_tokens < 1 or n + max_tokens > self.max_model_len:
            raise PromptTooLongError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{n + max(max_tokens, 0)} tokens ({n} in the prompt, {max_tokens} for the completion)."
            )
        if self.block_manager.blocks_needed(n + max_tokens) > self.block_manager.num_blocks:
            raise PromptTooLongError("The request needs more KV cache than this engine has.")
        seq = Sequence(request_id, prompt_token_ids, sampling, max_tokens=max_tokens, priority=priority,
                       cache_salt=cache_salt, arrival_time=arrival_time)
        if sampling.seed is not None:
            seq.generator = torch.Generator().manual_seed(sampling.seed)
        seq.detok = detokenizer_for(self.tokenizer, skip_special_tokens=sampling.skip_special_tokens)
        seq.stopper = StopChecker(sampling, eos_token_id=self.eos_token_id, max_tokens=max_tokens,
                                  max_model_len=self.max_model_len)
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Free the request's blocks now; the next step() reports it finished ("abort")."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        self._pending.append(self._output(seq, [], "", None))
        return True

    def has_unfinished(self) -> bool:
        return (self.scheduler.has_unfinished() or bool(self._pending) or bool(self._deferred)
                or self._inflight is not None)

    # ---- one iteration ------------------------------------------------------------------------
    def step(self, *, on_first_tokens: Callable[[list[str]], None] | None = None) -> list[RequestOutput]:
        """One iteration: schedule, run the model, sample; the outputs of this step (or, with
        async_output, of the previous one).

        `on_first_tokens`, if given, is called after scheduling and before the model runs with the
        ids of the requests whose first token this step samples (a worker marks them started in
        its queue while the model computes).
        """
        if self.async_scheduling:
            return self._step_ahead(on_first_tokens)
        outputs, self._pending = self._pending, []
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        t1 = time.perf_counter()
        self.timers["schedule_s"] += t1 - t0
        if not batch:
            if self._deferred:
                outputs += self._emit_deferred()
                self.timers["output_s"] += time.perf_counter() - t1
            return outputs
        if on_first_tokens is not None:
            batch.notify_first_tokens(on_first_tokens)
        try:
            inputs = self.runner.prepare(batch.seqs, batch.num_new_tokens)
            t1b = time.perf_counter()
            seqs, logits = self.runner.run(*inputs)
            t2 = time.perf_counter()
            pending = self.sampler.launch(logits, seqs) if seqs else None
        except Exception as exc:  # noqa: BLE001 - pinned to its request(s) below
            return outputs + self._emit_deferred() + self._recover(batch, exc)
        self.scheduler.postprocess(batch)
        t2b = time.perf_counter()
        if self.async_output:
            outputs += self._emit_deferred()  # the previous step's outputs, while the GPU works
        t2c = time.perf_counter()
        try:
            sampled = self.sampler.finish(pending) if pending is not None else None
        except Exception as exc:  # noqa: BLE001
            for seq, n in zip(batch.seqs, batch.num_new_tokens):  # undo postprocess: the step is rerun
                seq.num_computed_tokens -= n
            return outputs + self._recover(batch, exc)
        t3 = time.perf_counter()
        now = time.time()
        taken = []
        if sampled is not None:
            taken = self._take_all(seqs, sampled.token_ids, sampled.logprobs, now, outputs)
        t3b = time.perf_counter()
        if self.async_output:
            self._deferred = taken
        else:
            outputs += self._emit_all(taken, now)
        if self._failed_steps:
            self._failed_steps = 0
        t4 = time.perf_counter()
        self.timers["sample_s"] += (t2b - t2) + (t3 - t2c)
        self.timers["take_s"] += t3b - t3
        self.timers["output_s"] += (t2c - t2b) + (t4 - t3b)
        self.timers["prepare_s"] += t1b - t1
        self.timers["model_s"] += t2 - t1b
        self._count(batch, len(seqs), now)
        return outputs

    def _count(self, batch, num_sampled: int, now: float) -> None:
        n_prompt = batch.num_tokens - num_sampled
        self.counters["steps"] += 1
        self.counters["prompt_tokens"] += n_prompt
        self.counters["generated_tokens"] += num_sampled
        self._recent.append((now, n_prompt, num_sampled))
        while self._recent and self._recent[0][0] < now - _RATE_WINDOW_S:
            self._recent.popleft()

    # ---- a sampled token, in two halves: what the next schedule needs, then its output -----------
    # Synchronous engines run both in the same step; with async_output the second half of a step's
    # tokens runs during the next step.
    def _take_token(self, seq: Sequence, token: int, lp, now: float) -> tuple:
        """Append the token and decide stop tokens and length limits (finishing the request at once)."""
        out = seq.output_token_ids
        out.append(token)  # Sequence.append_token, inline: this runs for every sequence every step
        seq.token_ids.append(token)
        if seq.first_token_time is None:
            seq.first_token_time = now
        n_out = len(out)
        stopper = seq.stopper
        stop = stopper.check_token(token, n_out)
        if stop is not None:
            reason, seq.stop_reason = stop
            self.scheduler.finish(seq, reason)
        elif stopper.check_length(n_out, len(seq.token_ids)):
            self.scheduler.finish(seq, "length")
        return seq, token, lp, n_out, stop is not None

    def _emit_deferred(self) -> list[RequestOutput]:
        """The previous step's outputs (async_output)."""
        deferred, self._deferred = self._deferred, []
        # aborted since: its abort notice is the last word
        return self._emit_all([taken for taken in deferred if taken[0].finish_reason != "abort"], time.time())

    def _take_all(self, seqs: list[Sequence], token_ids: list[int], lps, now: float,
                  outputs: list[RequestOutput]) -> list[tuple]:
        """`_take_token` for each sampled row; a row that fails ends its request alone (into `outputs`)."""
        taken = []
        take = self._take_token
        for i, seq in enumerate(seqs):
            if seq.status is FINISHED:  # async_output: a late stop string or an abort; this token is dropped
                continue
            try:
                taken.append(take(seq, token_ids[i], None if lps is None else lps[i], now))
            except Exception as exc:  # noqa: BLE001 - this sequence's own failure ends it alone
                outputs.append(self._fail_seq(seq, exc))
        return taken

    def _emit_all(self, taken: list[tuple], now: float) -> list[RequestOutput]:
        """`_emit` for each taken token; one that fails (detokenizing, stop strings) ends its request alone."""
        outputs = []
        emit = self._emit
        for t in taken:
            try:
                outputs.append(emit(t, now))
            except Exception as exc:  # noqa: BLE001
                outputs.append(self._fail_seq(t[0], exc))
        return outputs

    def _emit(self, taken: tuple, now: float) -> RequestOutput:
        """Text delta and stop strings of a taken token, and its RequestOutput. A stop string in the
        text wins over a length limit reached by the same token."""
        seq, token, lp, n_out, stopped_by_token = taken
        stopper = seq.stopper
        text, hit = "", None
        if not stopped_by_token:
            text, hit = stopper.feed(seq.detok.add(token), n_out)
            if hit is not None:
                seq.stop_reason = hit
                if seq.status is FINISHED:
                    seq.finish_reason = "stop"
                else:
                    self.scheduler.finish(seq, "stop")
        if hit is None and seq.status is FINISHED:  # flush what the detokenizer and stop checker hold
            tail, hit = stopper.feed(seq.detok.finish(), n_out)
            text += tail
            if hit is not None:
                seq.finish_reason, seq.stop_reason = "stop", hit
            else:
                text += stopper.flush()
        logprobs = [self.logprob_formatter.format(token, lp)] if lp is not None else None
        return self._output(seq, [token], text, logprobs, now)

    def _output(self, seq: Sequence, tokens: list[int], text: str, logprobs, now: float | None = None) -> RequestOutput:
        arrival, end = seq.arrival_time, seq.finish_time
        if end is None:
            end = time.time() if now is None else now
        scheduled, first = seq.first_scheduled_time, seq.first_token_time
        # Built for every sequence every step: the three records by position (their fields' order), attributes
        # read directly (keyword arguments and property calls were half of this function's time).
        return RequestOutput(
            seq.request_id, tokens, text, logprobs, seq.status is FINISHED, seq.finish_reason,
            Usage(len(seq.prompt_token_ids), seq.cached_tokens, len(seq.output_token_ids)),
            Timing(None if scheduled is None else scheduled - arrival, None if first is None else first - arrival,
                   end - arrival),
            seq.stop_reason,
        )

    # ---- offline batch ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams],
                 *, priorities: list[int] | None = None, cache_salt: str | None = None) -> list[RequestOutput]:
        """Run `prompts` to completion; return one cumulative RequestOutput per prompt, in order."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        ids = [f"gen-{next(self._ids)}" for _ in prompts]
        for rid, prompt, sp, prio in zip(ids, prompts, params, priorities or [0] * len(prompts)):
            self.add_request(rid, prompt, sp, priority=prio, cache_salt=cache_salt)
        results = {rid: None for rid in ids}
        while any(r is None or not r.finished for r in results.values()):
            for out in self.step():
                if out.request_id not in results:
                    continue
                acc = results[out.request_id]
                if acc is None:
                    results[out.request_id] = out
                    out.logprobs = list(out.logprobs) if out.logprobs is not None else None
                    continue
                acc.new_token_ids.extend(out.new_token_ids)
                acc.delta_text += out.delta_text
                if out.logprobs is not None:
                    acc.logprobs.extend(out.logprobs)
                acc.finished, acc.finish_reason, acc.stop_reason = out.finished, out.finish_reason, out.stop_reason
                acc.usage, acc.timing = out.usage, out.timing
        for prompt, rid in zip(prompts, ids):
            results[rid].prompt_token_ids = list(prompt)
        return [results[rid] for rid in ids]

    # ---- introspection ------------------------------------------------------------------------
    def stats(self) -> dict:
        bm = self.block_manager
        span = (self._recent[-1][0] - self._recent[0][0]) if len(self._recent) > 1 else 0.0
        prompt_rate = sum(r[1] for r in self._recent) / span if span > 0 else 0.0
        gen_rate = sum(r[2] for r in self._recent) / span if span > 0 else 0.0
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_usage": bm.usage,
            "num_blocks": bm.num_blocks,
            "kv_cache_bytes": self.kv_plan.bytes,
            "kv_cache_tokens": self.kv_plan.tokens,
            "free_blocks": bm.num_free_blocks,
            "cached_blocks": bm.num_cached_blocks,
            "prefix_cache_hit_rate": bm.hit_rate,
            "prefix_cache_queries": bm.query_tokens,
            "prefix_cache_hits": bm.hit_tokens,
            "preemptions": self.scheduler.num_preemptions,
            "system_fingerprint": self.system_fingerprint,
            "batch_invariant": self.config.batch_invariant,
            "prompt_tok_s": prompt_rate,
            "generation_tok_s": gen_rate,
            **self.counters,
            **self.timers,
        }
