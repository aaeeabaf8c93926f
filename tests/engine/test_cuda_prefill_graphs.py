"""PrefillGraphRunner: the piecewise forward on static buffers equals the plain one.

On the CPU (capture=False) this proves the runner's bookkeeping on the real SmolLM2
model: prompt steps, mixed steps with and without the decode split, a smaller step
after a bigger one (the rows it leaves become padding again and never write the KV
cache), steps past the top rung declined. Under Triton's interpreter the same on the
GPU kernels (the prefill kernel writing into the static attention buffer). On a CUDA
device the pieces are captured and replayed, against the eager forward and against
the same runner uncaptured; and an engine with the graphs gives the tokens of one
without them.
"""

from __future__ import annotations

import pytest
import torch

from inference.engine.prefill_graphs import PrefillGraphRunner

from tests.engine.paged_inputs import Batches, first_layers
from tests.engine.test_cuda_graphs import check_step, clone_caches, cuda_model, elementwise, relative_norm

pytestmark = pytest.mark.slow


def steps_of(batches: Batches, seqs: list[int]):
    """The steps every test runs, as (chunks, decodes in front) over ``seqs`` (8 sequences, none started):
    whole prompts; a chunk beside decodes, split and unsplit; one long chunk; a small step after big ones."""
    a, b, c, d, e, f, g, h = seqs
    return [
        ([(a, 37), (b, 16), (c, 5)], 0),  # whole prompts: 58 tokens, padded to 64
        ([(d, 20), (e, 33)], 0),
        ([(a, 1), (b, 1), (c, 1), (d, 9), (e, 40)], 3),  # mixed, the decodes split off (in front)
        ([(f, 30), (a, 1), (g, 3), (b, 1)], 0),  # mixed, unsplit: every row through the prefill kernel
        ([(h, 100)], 0),  # one prompt over several blocks: 100 tokens, padded to 128
        ([(c, 1), (d, 1)], 2),  # two decodes alone: decode-only, through the runner's decode branch
        ([(e, 1), (f, 2)], 1),  # a small step after the 128-token one: rows 3..127 must be padding again
    ]


def run_steps(model, batches: Batches, runner, close):
    seqs = batches.new_sequences(8)
    for chunks, decodes in steps_of(batches, seqs):
        ids, positions, meta, slots = batches.build(chunks)
        meta.num_decodes = decodes
        check_step(model, runner, batches.caches, runner.kv_caches, ids, positions, meta, slots, close=close)


def test_cpu_runner_matches_eager_and_never_writes_padding(smollm_fp32):
    model, config = smollm_fp32.model, smollm_fp32.config
    batches = Batches(config, num_blocks=64, dtype=torch.float32, device="cpu")
    runner = PrefillGraphRunner(model, clone_caches(batches.caches), max_tokens=128, device="cpu", capture=True)
    assert not runner.capture  # refused on the CPU: the same pieces, eagerly
    assert runner.sizes == (16, 32, 64, 128)
    # Padding changes the matmuls' row count, and the CPU's float32 GEMM sums in another order for another
    # row count: a few 1e-5 apart after 30 layers (as for the decode graphs).
    run_steps(model, batches, runner, elementwise(1e-4, 5e-5))
    assert runner.graphs == {}


def test_cpu_runner_declines_what_it_cannot_run(smollm_fp32):
    model, config = smollm_fp32.model, smollm_fp32.config
    batches = Batches(config, num_blocks=16, dtype=torch.float32, device="cpu")
    runner = PrefillGraphRunner(model, clone_caches(batches.caches), max_tokens=40, device="cpu", capture=False)
    assert runner.sizes == (16, 32, 40)  # the budget between two rungs becomes the top one
    seqs = batches.new_sequences(2)
    ids, positions, meta, _ = batches.build([(seqs[0], 41)])
    assert runner.run(ids, positions, meta) is None  # over the token budget
    ids, positions, meta, _ = batches.build([(seqs[1], 40)])
    with torch.inference_mode():
        out = runner.run(ids, positions, meta)
    assert out is not None and out.shape == (40, config.hidden_size)
    meta.batch_invariant = True
    assert runner.run(ids, positions, meta) is None  # batch-invariant steps run their own kernels


def test_runner_through_triton_launchers_on_cpu(smollm_fp32, kernel_config):
    """The GPU kernels under Triton's interpreter: the prefill kernel writes into the runner's static
    attention buffer, the split decodes' rows after it. Two layers keep the interpreter quick."""
    from kernels._triton import interpreter_active

    if not interpreter_active():
        pytest.skip("Triton's interpreter is off (TRITON_INTERPRET=1 is set only on hosts without a GPU)")
    kernel_config(backend="triton")
    model, config = first_layers(smollm_fp32, 2)
    batches = Batches(config, num_blocks=64, dtype=torch.float32, device="cpu")
    runner = PrefillGraphRunner(model, clone_caches(batches.caches), max_tokens=128, device="cpu", capture=False)
    run_steps(model, batches, runner, elementwise(1e-5, 1e-4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to capture and replay graphs")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_cuda_piecewise_replay_matches_eager(dtype):
    model, config = cuda_model(dtype)
    batches = Batches(config, num_blocks=512, dtype=dtype, device="cuda")
    runner = PrefillGraphRunner(model, clone_caches(batches.caches), max_tokens=256, device="cuda", capture=True)
    assert runner.capture
    runner.capture_all()  # padding-only warm-up and capture: must leave the cache untouched
    assert all(torch.equal(kb, kg) and torch.equal(vb, vg)
               for (kb, vb), (kg, vg) in zip(batches.caches, runner.kv_caches)), "capture_all wrote to the KV cache"
    assert set(runner.graphs) == set(runner.sizes)
    assert all(len(g) == config.num_layers + 1 for g in runner.graphs.values())
    # another row count in every matmul (padding), so rounding differences; bf16 spreads them through 30 layers
    close = elementwise(1e-4, 1e-3) if dtype == torch.float32 else relative_norm(2e-2)
    run_steps(model, batches, runner, close)
    # the uncaptured runner (the debugging switch) runs the same padded pieces: it agrees with the replay
    seqs = batches.new_sequences(2)
    ids, positions, meta, _ = batches.build([(seqs[0], 70), (seqs[1], 12)])
    outputs = []
    for capture in (False, True):
        other = PrefillGraphRunner(model, clone_caches(runner.kv_caches), max_tokens=256, device="cuda",
                                   capture=capture)  # the captured one captures lazily, on this first use
        with torch.inference_mode():
            outputs.append(other.run(ids, positions, meta).clone())
        assert set(other.graphs) == ({128} if capture else set())
    same = elementwise(1e-5, 1e-5) if dtype == torch.float32 else relative_norm(1e-3)
    same(outputs[1], outputs[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_with_prefill_graphs_gives_the_eager_tokens(tmp_path):
    """The engine end to end, float32, random SmolLM2-shaped weights: chunked prompts, mixed steps, a prefix
    hit; with the piecewise graphs the same greedy tokens as without them."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from gpu_engine import SHAPES, write_checkpoint

    from inference.engine import Engine, EngineConfig, SamplingParams

    write_checkpoint(SHAPES["smollm2-135m"], tmp_path, seed=0)
    rng = random.Random(3)
    shared = [rng.randrange(3, 49152) for _ in range(48)]
    prompts = [shared + [rng.randrange(3, 49152) for _ in range(rng.randrange(5, 400))] for _ in range(20)]
    sampling = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def run(prefill_graphs: bool):
        engine = Engine(EngineConfig(model=str(tmp_path), device="cuda", dtype="float32", kv_cache_mb=256,
                                     max_num_seqs=32, max_num_batched_tokens=512, enable_prefix_caching=True,
                                     prefill_graphs=prefill_graphs))
        assert (engine.runner.prefill_runner is not None) is prefill_graphs
        tokens = [o.new_token_ids for o in engine.generate(prompts, sampling)]
        return tokens, engine.block_manager.hit_rate

    eager, _ = run(False)
    graphs, hit_rate = run(True)
    assert hit_rate > 0  # the shared prefix was served from the cache
    assert graphs == eager
