"""The native decoder stack (inference/engine/native_stack.py, kernels/csrc/decode_stack.cpp) against the per-op
path it replaces, on the real SmolLM2 in bfloat16 with its packed int4 projections: the same kernels in the same
order, so every greedy token and every logprob must be the same bits, for one row, for several sequences' rows,
for speculative draft rows, and across preemption and prefix-cache hits (whose steps mix both paths)."""

from __future__ import annotations

import pytest
import torch

from inference.engine import Engine, EngineConfig, SamplingParams
from inference.engine import native_stack as native_stack_module
from kernels import decode_stack_cpu

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not decode_stack_cpu.load(), reason="the native decoder stack did not build here")]

PASSAGE = ("The harbour town kept its lighthouse lit through every storm of the winter, and the keeper wrote "
           "each night's weather in a ledger that the council later printed. ") * 6


def build(**overrides) -> Engine:
    # the default mode's decode path (batch-invariant mode, on by default on CPUs without bf16 GEMM, runs every
    # step through the stack: test_batch_invariant_mode_takes_it_for_every_step_with_the_same_bits)
    config = dict(dtype="bfloat16", num_kv_blocks=96, max_num_seqs=4, max_num_batched_tokens=256,
                  enable_prefix_caching=False, batch_invariant=False)
    return Engine(EngineConfig(**{**config, **overrides}))


@pytest.fixture(scope="module")
def engine():
    return build()


@pytest.fixture(scope="module")
def spec_engine():
    return build(speculative="ngram")


def prompts(engine) -> list[list[int]]:
    tok = engine.tokenizer
    return [tok.encode(PASSAGE + "Repeat the first sentence word for word."),
            tok.encode("List three colours of the sea at dawn."),
            tok.encode("def add(a, b):\n    return a + b\n\nExplain this function.")]


def generate(engine, batch, native: bool, monkeypatch, **params):
    """-> (token ids, logprobs) a request, and how many steps took the native stack."""
    model = engine.runner.model
    calls = []
    real_run = decode_stack_cpu.run

    def counting_run(*args):
        calls.append(args[1].shape[0])
        return real_run(*args)

    monkeypatch.setattr(decode_stack_cpu, "run", counting_run)
    saved = model.native_stack
    engine.block_manager.reset_prefix_cache()  # each run prefills from the same (empty) cache
    if not native:
        model.native_stack = False
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=40, logprobs=2, ignore_eos=True, **params)
        outs = engine.generate(batch, sp)
    finally:
        model.native_stack = saved
        monkeypatch.undo()
    return [(o.new_token_ids, o.logprobs) for o in outs], calls


def test_the_smollm2_bf16_model_takes_the_native_stack(engine):
    engine.generate([prompts(engine)[1]], SamplingParams(temperature=0.0, max_tokens=2))
    assert isinstance(engine.runner.model.native_stack, native_stack_module.NativeStack)


@pytest.mark.parametrize("count", [1, 3])
def test_greedy_tokens_and_logprobs_are_the_per_op_paths_bits(engine, monkeypatch, count):
    batch = prompts(engine)[:count]
    native, calls = generate(engine, batch, True, monkeypatch)
    per_op, no_calls = generate(engine, batch, False, monkeypatch)
    assert native == per_op
    assert no_calls == [] and len(calls) >= 39  # every decode step but those that joined a prefill
    assert max(calls) == count


def test_speculative_draft_rows_give_the_per_op_paths_bits(spec_engine, monkeypatch):
    batch = prompts(spec_engine)[:2]
    native, calls = generate(spec_engine, batch, True, monkeypatch)
    per_op, _ = generate(spec_engine, batch, False, monkeypatch)
    assert native == per_op
    assert max(calls) > 2  # draft rows: more rows than sequences in some step


def test_preemption_and_prefix_hits_keep_the_bits(monkeypatch):
    small = build(num_kv_blocks=20, enable_prefix_caching=True)
    batch = prompts(small) + [prompts(small)[0]]
    native, calls = generate(small, batch, True, monkeypatch)
    per_op, _ = generate(small, batch, False, monkeypatch)
    assert native == per_op and calls
    assert small.scheduler.num_preemptions > 0


def test_batch_invariant_mode_takes_it_for_every_step_with_the_same_bits(monkeypatch):
    invariant = build(batch_invariant=True, max_num_batched_tokens=64)  # prompts come in chunks of rows
    batch = prompts(invariant)
    native, calls = generate(invariant, batch, True, monkeypatch)
    per_op, no_calls = generate(invariant, batch, False, monkeypatch)
    assert native == per_op and no_calls == []
    assert max(calls) == 64  # prompt chunks too, not only decodes


def test_a_float32_model_keeps_the_per_op_path():
    f32 = Engine(EngineConfig(dtype="float32", num_kv_blocks=16, max_num_seqs=2))
    f32.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=2))
    assert f32.runner.model.native_stack is False


def test_bad_metadata_is_an_error_not_a_crash(engine):
    model = engine.runner.model
    stack = model.native_stack
    assert isinstance(stack, native_stack_module.NativeStack)
    k, v = engine.runner.kv_caches[0]
    slots = k.shape[0] * k.shape[1]
    hidden = model.embed(torch.tensor([5]))
    args = dict(positions=torch.tensor([0]), block_tables=torch.zeros(1, 1, dtype=torch.int32),
                seq_lens=torch.tensor([1], dtype=torch.int32), cos_sin=model.cos_sin_cache(hidden.device))
    caches = engine.runner.kv_caches
    with pytest.raises(RuntimeError, match="slot"):
        decode_stack_cpu.run(stack.handle, hidden, args["positions"], torch.tensor([slots]), args["block_tables"],
                             args["seq_lens"], args["cos_sin"], [c[0] for c in caches], [c[1] for c in caches])
    with pytest.raises(RuntimeError, match="rotary position"):
        decode_stack_cpu.run(stack.handle, hidden, torch.tensor([10 ** 7]), torch.tensor([-1]), args["block_tables"],
                             args["seq_lens"], args["cos_sin"], [c[0] for c in caches], [c[1] for c in caches])
    with pytest.raises(RuntimeError, match="attention"):
        decode_stack_cpu.run(stack.handle, hidden, args["positions"], torch.tensor([-1]), args["block_tables"],
                             torch.tensor([10 ** 6], dtype=torch.int32), args["cos_sin"], [c[0] for c in caches],
                             [c[1] for c in caches])
    with pytest.raises(RuntimeError, match="no model registered"):
        decode_stack_cpu.run(10 ** 9, hidden, args["positions"], torch.tensor([-1]), args["block_tables"],
                             args["seq_lens"], args["cos_sin"], [c[0] for c in caches], [c[1] for c in caches])
    # the engine still serves
    out = engine.generate([prompts(engine)[1]], SamplingParams(temperature=0.0, max_tokens=4))[0]
    assert out.finished and len(out.new_token_ids) == 4
