"""The engine: requests in, per-step outputs out.

    engine = Engine(EngineConfig(model="smollm2-135m-instruct"))
    engine.add_request("r1", prompt_ids, SamplingParams(max_tokens=32))
    while engine.has_unfinished():
        for out in engine.step(): ...

One `step()` schedules a batch (scheduler + block manager), runs the model on
it (model runner), samples the rows that are due (sampler) and turns the new
tokens into text deltas and stop decisions (detokenizer + stop checker).

The engine holds its parts and wires them; each part is given the others it uses:
the step order (`SyncStepOrder` in inference.engine.sync_step, or
`AsyncSchedulingOrder` in inference.engine.async_step) runs a step; `TokenOutputs`
(inference.engine.token_outputs) takes sampled tokens and builds their outputs;
`StepFailureHandler` (inference.engine.step_isolation) handles a step that raises;
`StepMeter` (inference.engine.step_meter) counts and times the steps.

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

import dataclasses
import itertools
import logging
from collections.abc import Callable

import torch

from kernels.dispatch import get_ops

from inference.engine.async_step import AsyncSchedulingOrder
from inference.engine.block_manager import BlockManager
from inference.engine.config import EngineConfig, resolve_step_order
from inference.engine.detokenizer import detokenizer_for
from inference.engine.fingerprint import system_fingerprint
from inference.engine.invariant_mode import invariant_default
from inference.engine.logprobs import LogprobFormatter
from inference.engine.model_runner import ModelRunner
from inference.engine.outputs import RequestOutput, request_output
from inference.engine.sampler import Sampler
from inference.engine.sampling_params import EngineValidationError, PromptTooLongError, SamplingParams
from inference.engine.scheduler import Scheduler
from inference.engine.scheduler_policy import PriorityPolicy
from inference.engine.ngram_proposer import Speculator
from inference.engine.sequence import Sequence
from inference.engine.spec_step import SpecSampling
from inference.engine.step_isolation import EngineDeadError, StepFailureHandler
from inference.engine.step_meter import StepMeter
from inference.engine.stop_checker import StopChecker
from inference.engine.structured import StructuredGate
from inference.engine.sync_step import SyncStepOrder
from inference.engine.token_outputs import TokenOutputs

logger = logging.getLogger(__name__)


class Engine:
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
        if config.batch_invariant is None:  # auto: on where it costs little (inference.engine.invariant_mode)
            on = not (config.fp8_weights or config.fp8_lm_head) and invariant_default(loaded.model, self.device, dtype)
            config = dataclasses.replace(config, batch_invariant=on)
            self.config = config
        self.loaded = loaded
        self.model_config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.vocab_size = loaded.config.vocab_size
        self.max_model_len = min(config.max_model_len or loaded.max_model_len, loaded.config.max_position_embeddings)
        self.kv_plan = engine_kv_plan(config, loaded.config, device=self.device, dtype=dtype,
                                      max_model_len=self.max_model_len, free_bytes=free_bytes, weights=own_weights)
        logger.info("%s on %s: KV cache %s", config.model, self.device, self.kv_plan.describe())
        self._build_model_parts(config, self.kv_plan.num_blocks, dtype)
        # what decides this engine's tokens, hashed (OpenAI's system_fingerprint; inference.engine.fingerprint)
        self.system_fingerprint = system_fingerprint(weights=loaded.source.path, dtype=dtype, device=self.device,
                                                     backend=get_ops(self.device).backend
                                                     + "+fp8" * config.fp8_weights + "+fp8_head" * config.fp8_lm_head
                                                     + "+ngram" * (config.speculative == "ngram"),
                                                     batch_invariant=config.batch_invariant)
        self.eos_token_id = self.tokenizer.eos_token_id
        self.sampler = Sampler(eos_token_id=self.eos_token_id, seed=config.seed, per_row=config.batch_invariant)
        self.logprob_formatter = LogprobFormatter(self.tokenizer)
        if self.tokenizer.byte_level:
            self.tokenizer.token_text_table()  # now, not in the first request's step (detokenizer, logprobs)
        self._pending: list[RequestOutput] = []  # abort notices for the next step()
        self.async_output, self.async_scheduling = resolve_step_order(
            self.device.type, config.async_output, config.async_scheduling)
        self._ids = itertools.count()
        self._wire_step()
        if config.speculative != "off" and self.speculator is None:
            logger.warning("speculative decoding is off: it does not run with async scheduling (the CUDA default)")

    def _build_model_parts(self, config: EngineConfig, num_blocks: int, dtype: torch.dtype) -> None:
        """The KV cache's block manager, the scheduler over it and the model runner."""
        # a model whose every layer is windowed gives back the blocks behind the window (block_manager)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching,
                                          window=self.model_config.kv_window)
        self.speculator = speculator_for(config, self.device.type)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            policy=PriorityPolicy(aging_s=config.priority_aging_s, max_preemptions=config.max_preemptions),
            background_priority=config.background_priority,
            speculator=self.speculator,
        )
        loaded = self.loaded
        self.runner = ModelRunner(loaded.model, loaded.config, num_blocks=num_blocks,
                                  block_size=config.block_size, dtype=dtype, device=self.device,
                                  max_num_seqs=config.max_num_seqs, max_model_len=self.max_model_len,
                                  cuda_graphs=config.cuda_graphs, batch_invariant=config.batch_invariant,
                                  prefill_graphs=config.prefill_graphs,
                                  max_num_batched_tokens=config.max_num_batched_tokens,
                                  fp8_weights=config.fp8_weights, fp8_lm_head=config.fp8_lm_head)

    def _wire_step(self) -> None:
        """The collaborators of a step, each given the parts it uses: token handling, step-failure
        handling, the meter, and the step order (sync, with or without deferred outputs, or async
        scheduling)."""
        self.meter = StepMeter()
        # structured outputs: requests wait here for their grammar, compiled off this thread (engine.structured)
        self.structured = StructuredGate(self.tokenizer, self.vocab_size, self.scheduler)
        self.tokens = TokenOutputs(self.scheduler, self.logprob_formatter)
        self.failures = StepFailureHandler(scheduler=self.scheduler, runner=self.runner, sampler=self.sampler,
                                           tokens=self.tokens, meter=self.meter)
        parts = dict(scheduler=self.scheduler, runner=self.runner, sampler=self.sampler, tokens=self.tokens,
                     failures=self.failures, meter=self.meter)
        spec = None
        if self.speculator is not None:
            spec = SpecSampling(sampler=self.sampler, speculator=self.speculator, tokens=self.tokens,
                                block_manager=self.block_manager)
        self.step_order: SyncStepOrder | AsyncSchedulingOrder = (
            AsyncSchedulingOrder(block_manager=self.block_manager, **parts) if self.async_scheduling
            else SyncStepOrder(async_output=self.async_output, spec=spec, **parts))

    @property
    def dead(self) -> str | None:
        """Why the engine stopped taking requests (a broken device), if it did."""
        return self.failures.dead

    @property
    def counters(self) -> dict:
        if self.speculator is None:
            return self.meter.counters
        return {**self.meter.counters, **self.speculator.counters}

    @property
    def timers(self) -> dict:
        """Wall time per phase of step() (inference.engine.step_meter)."""
        return self.meter.timers

    @timers.setter
    def timers(self, timers: dict) -> None:
        self.meter.timers = timers

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
        bm = self.block_manager
        if bm.peak_blocks(n + max_tokens, self.config.max_num_batched_tokens) > bm.capacity:
            raise PromptTooLongError("The request needs more KV cache than this engine has.")
        seq = Sequence(request_id, prompt_token_ids, sampling, max_tokens=max_tokens, priority=priority,
                       cache_salt=cache_salt, arrival_time=arrival_time)
        if sampling.seed is not None:
            seq.generator = torch.Generator().manual_seed(sampling.seed)
        seq.detok = detokenizer_for(self.tokenizer, skip_special_tokens=sampling.skip_special_tokens)
        seq.stopper = StopChecker(sampling, eos_token_id=self.eos_token_id, max_tokens=max_tokens,
                                  max_model_len=self.max_model_len)
        if sampling.structured_output is not None:  # structured outputs: scheduled once its grammar is compiled
            self.structured.submit(seq)
            return
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Free the request's blocks now; the next step() reports it finished ("abort")."""
        seq = self.scheduler.abort(request_id) or self.structured.abort(request_id)
        if seq is None:
            return False
        self._pending.append(request_output(seq, [], "", None))
        return True

    def has_unfinished(self) -> bool:
        return (self.scheduler.has_unfinished() or bool(self._pending) or self.step_order.holds_work()
                or bool(self.structured.waiting))

    # ---- one iteration ------------------------------------------------------------------------
    def step(self, *, on_first_tokens: Callable[[list[str]], None] | None = None) -> list[RequestOutput]:
        """One iteration: schedule, run the model, sample; the outputs of this step (or, with
        async_output, of the previous one).

        `on_first_tokens`, if given, is called after scheduling and before the model runs with the
        ids of the requests whose first token this step samples (a worker marks them started in
        its queue while the model computes).
        """
        outputs, self._pending = self._pending, []
        outputs += self.structured.poll()  # requests whose grammar is ready enter the scheduler
        return self.step_order.step(outputs, on_first_tokens)

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
        prompt_rate, gen_rate = self.meter.rates()
        return {
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "kv_usage": bm.usage,
            "num_blocks": bm.capacity,  # without the null block of a windowed model
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


def speculator_for(config: EngineConfig, device_type: str) -> Speculator | None:
    """The engine's draft proposer (speculative decoding), or None: off, or async scheduling in force."""
    if config.speculative == "off" or resolve_step_order(device_type, config.async_output, config.async_scheduling)[1]:
        return None
    max_rows = config.speculative_max_rows or (256 if device_type == "cuda" else 8)
    return Speculator(num_tokens=config.num_speculative_tokens, min_n=config.spec_ngram_min,
                      max_n=config.spec_ngram_max, max_rows=max_rows)
