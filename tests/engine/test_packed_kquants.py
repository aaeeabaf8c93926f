"""Gemma 3's packed decode paths: Q8_0/Q5_0/Q4_0 layers as exact int8 blocks of 32 and Q6_K ones as exact int8
blocks of 16 (kernels/q8_matmul_cpu.py) and
Q4_K layers as exact int4 groups, against gguf's own dequantizer; a tiny Gemma 3 GGUF whose decode logits with
the packed copies agree with the dense ones; the real Gemma 3 270M file loads with them attached."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from inference.engine import packed_linear
from inference.engine.dequant import int4_groups, int8_blocks
from inference.engine.gguf_loader import load_gguf
from inference.engine.loader import LoadedModel, build_model, load_model
from inference.engine.registry import resolve_model
from inference.engine.packed_linear import Int8Blocks, Linear, Q5Blocks
from kernels.q8_matmul_cpu import q5_supported, q5_to_int8, q8_matmul_cpu
from tests.engine.arch_helpers import Q, random_prompt
from tests.engine.test_dequant import random_blocks

INT8_TYPES = [Q.Q8_0, Q.Q5_0, Q.Q4_0]
needs_int8 = pytest.mark.skipif(not packed_linear.int8_supported(torch.device("cpu"), torch.bfloat16),
                                reason="the native CPU kernels are unavailable")


@pytest.mark.parametrize("qtype", INT8_TYPES, ids=lambda q: q.name)
def test_int8_blocks_equal_gguf_dequantize(qtype):
    for raw in (random_blocks(qtype, rows=16, blocks_per_row=4, seed=7),
                gguf_quantize(np.random.default_rng(2).normal(size=(16, 128)).astype(np.float32), qtype)):
        blocks = int8_blocks(raw, qtype, (16, 128))
        assert blocks.codes.dtype == torch.int8 and blocks.scales.shape == (16, 4)
        low, high = {Q.Q8_0: (-128, 127), Q.Q5_0: (-16, 15), Q.Q4_0: (-8, 7)}[qtype]
        assert low <= int(blocks.codes.min()) and int(blocks.codes.max()) <= high
        np.testing.assert_array_equal(blocks.dequantize().numpy(), gguf_dequantize(raw, qtype))  # bit-identical


def test_q6_k_int8_blocks_of_16_equal_gguf_dequantize():
    """Q6_K: codes q6-32 (-32..31) in sub-blocks of 16, each with its scale d*sc: the same float32 weights
    as gguf's dequantizer (and our dense one), bit for bit."""
    from inference.engine.dequant import dequantize

    raw = random_blocks(Q.Q6_K, rows=8, blocks_per_row=3, seed=11)
    blocks = int8_blocks(raw, Q.Q6_K, (8, 768))
    assert blocks.codes.dtype == torch.int8 and blocks.scales.shape == (8, 48)
    assert -32 <= int(blocks.codes.min()) and int(blocks.codes.max()) <= 31
    np.testing.assert_array_equal(blocks.dequantize().numpy(), gguf_dequantize(raw, Q.Q6_K).reshape(8, 768))
    assert torch.equal(blocks.dequantize(), dequantize(raw, Q.Q6_K, (8, 768)))


@needs_int8
def test_q6_k_layer_reads_its_int8_blocks():
    n, k = 640, 2048  # Gemma 3 270M's ffn_down
    raw = random_blocks(Q.Q6_K, rows=n, blocks_per_row=k // 256, seed=5)
    blocks = int8_blocks(raw, Q.Q6_K, (n, k))
    layer = Linear(k, n, bias=False, dtype=torch.bfloat16).requires_grad_(False)
    layer.weight.copy_(blocks.dequantize())
    assert layer.attach_int8(blocks)
    x = torch.randn(packed_linear.INT8_LAYER_MAX_ROWS, k, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, q8_matmul_cpu(x, blocks.codes, blocks.scales).bfloat16())
    exact = x.double() @ blocks.dequantize().double().t()
    torch.testing.assert_close(out.double(), exact, rtol=1e-2, atol=1e-2 * float(exact.abs().max()))


def test_int8_blocks_of_32_and_16_do_not_join():
    assert Int8Blocks.cat([Int8Blocks(torch.zeros(2, 64, dtype=torch.int8), torch.ones(2, 2)),
                           Int8Blocks(torch.zeros(2, 64, dtype=torch.int8), torch.ones(2, 4))]) is None


def test_int8_blocks_refuse_other_types():
    assert int8_blocks(random_blocks(Q.Q4_1, 2, 1), Q.Q4_1, (2, 32)) is None
    assert int8_blocks(random_blocks(Q.Q4_K, 2, 1), Q.Q4_K, (2, 256)) is None


def test_q4_k_int4_groups_equal_gguf_dequantize():
    raw = random_blocks(Q.Q4_K, rows=8, blocks_per_row=2, seed=9)
    groups = int4_groups(raw, Q.Q4_K, (8, 512))
    assert groups.codes.dtype == torch.uint8 and int(groups.codes.max()) <= 15
    assert groups.scales.shape == groups.zeros.shape == (8, 16)
    expected = torch.from_numpy(gguf_dequantize(raw, Q.Q4_K))
    # (q-8)*scale is exact; zero = 8*scale - dmin*m is one float32 rounding more than d*sc*q - dmin*m
    torch.testing.assert_close(groups.dequantize(), expected, rtol=2e-7, atol=1e-6)


@needs_int8
@pytest.mark.parametrize("k,n", [(640, 1536), (1024, 640), (2048, 640), (640, 4096)])
def test_int8_layer_uses_the_blocks_for_few_rows_only(k, n):
    rng = np.random.default_rng(k + n)
    raw = gguf_quantize(rng.normal(size=(n, k)).astype(np.float32), Q.Q5_0)
    blocks = int8_blocks(raw, Q.Q5_0, (n, k))
    layer = Linear(k, n, bias=True, dtype=torch.bfloat16).requires_grad_(False)
    layer.weight.copy_(blocks.dequantize())
    assert layer.attach_int8(blocks)
    limit = packed_linear.INT8_LAYER_MAX_ROWS
    x = torch.randn(limit + 1, k, dtype=torch.bfloat16)
    out = layer(x[:limit])
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, q8_matmul_cpu(x[:limit], blocks.codes, blocks.scales).bfloat16() + layer.bias)
    dense = torch.nn.functional.linear(x[:limit].float(), layer.weight.float(), layer.bias.float())
    torch.testing.assert_close(out.float(), dense, rtol=2e-2, atol=2e-2 * float(dense.abs().max()))
    assert torch.equal(layer(x), layer.__class__.forward(_dense_copy(layer), x))  # more rows: the dense weight
    fixed = lambda a, w: torch.nn.functional.linear(a, w)  # noqa: E731  batch-invariant mode: always dense
    assert torch.equal(layer(x[:1], fixed=fixed), fixed(x[:1], layer.weight) + layer.bias)


def _dense_copy(layer: Linear) -> Linear:
    copy = Linear(layer.in_features, layer.out_features, bias=True, dtype=torch.bfloat16).requires_grad_(False)
    copy.weight.copy_(layer.weight)
    copy.bias.copy_(layer.bias)
    copy.prepacked = layer.prepacked
    return copy


def test_int8_layer_refuses_float32_and_wrong_shapes():
    blocks = Int8Blocks(torch.zeros(4, 64, dtype=torch.int8), torch.ones(4, 2))
    assert not Linear(64, 4, bias=False, dtype=torch.float32).attach_int8(blocks)
    assert not Linear(32, 4, bias=False, dtype=torch.bfloat16).attach_int8(blocks)


# -- a tiny Gemma 3 GGUF typed like the real one: q/k/gate/up Q5_0, v and the embedding Q8_0, o Q4_K -------

def _quantize_or_random_q4_k(values: np.ndarray, qtype: Q) -> np.ndarray:
    """gguf's quantizer, except Q4_K (which it lacks): valid random blocks of the values' shape."""
    if qtype != Q.Q4_K:
        return gguf_quantize(values, qtype)
    rows, cols = values.shape
    raw = random_blocks(Q.Q4_K, rows=rows, blocks_per_row=cols // 256, seed=rows + cols)
    raw = raw.reshape(-1, GGML_QUANT_SIZES[Q.Q4_K][1])
    raw[:, 0:4] = np.full((raw.shape[0], 2), 0.0005, np.float16).view(np.uint8)  # small d and dmin: sane layer
    return raw.reshape(rows, -1)


@pytest.fixture(scope="module")
def tiny_gemma3_gguf(tmp_path_factory):
    from tests.engine import arch_helpers
    from tests.engine.test_gemma3 import gemma3_gguf_tensors, hf_gemma3

    hf = hf_gemma3(head_dim=256, layers=3, pattern=3, scalar=256, seed=5)
    types = {"token_embd": Q.Q8_0, "attn_q": Q.Q5_0, "attn_k": Q.Q5_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_K,
             "ffn_gate": Q.Q5_0, "ffn_up": Q.Q5_0, "ffn_down": Q.Q4_0}
    path = tmp_path_factory.mktemp("gemma3-packed") / "tiny-gemma3.gguf"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arch_helpers, "gguf_quantize", _quantize_or_random_q4_k)
        arch_helpers.write_gguf(path, "gemma3", hf, gemma3_gguf_tensors(hf, types),
                                rope_theta=1e6, sliding_window=hf.config.sliding_window)
    return path


def _load_gguf(path, tokenizer, packed: bool) -> LoadedModel:
    """load_model's path for a GGUF without a tokenizer of its own (bf16 on the CPU), `tokenizer` attached."""
    cpu, bf16 = torch.device("cpu"), torch.bfloat16
    int4, int8 = packed_linear.int4_supported(cpu, bf16) and packed, packed_linear.int8_supported(cpu, bf16) and packed
    config, state, found = load_gguf(path, dtype=bf16, int4=int4, int8_head=int8, int8=int8)
    return LoadedModel(config, build_model(config, state, cpu, found), tokenizer, resolve_model(str(path)), bf16, cpu)


def _packed_kinds(model) -> collections.Counter:
    return collections.Counter(
        "int8" if m.int8 is not None else "int4" if m.int4_weight is not None else "dense"
        for m in model.modules() if isinstance(m, Linear))


@needs_int8
def test_tiny_gemma3_decode_logits_agree_with_and_without_packing(tiny_gemma3_gguf, smollm_tokenizer):
    packed = _load_gguf(tiny_gemma3_gguf, smollm_tokenizer, packed=True)
    dense = _load_gguf(tiny_gemma3_gguf, smollm_tokenizer, packed=False)
    # qkv, gate_up and down (Q4_0, int4 first) per layer; o_proj Q4_K as int4 where torch has the int4 matmul
    int4 = packed_linear.int4_supported(torch.device("cpu"), torch.bfloat16)
    assert _packed_kinds(packed.model) == ({"int8": 6, "int4": 6} if int4 else {"int8": 9, "dense": 3})
    assert _packed_kinds(dense.model) == {"dense": 12}
    # Exact codes against bf16 weights round differently: on this random model greedy tokens can part where
    # two logits nearly tie, so each decode step's logits must agree as test_llama_model's int4 check asks.
    from tests.engine.paged_inputs import PagedSequences

    runs = [PagedSequences(loaded.model, dtype=torch.bfloat16) for loaded in (packed, dense)]
    prompt = random_prompt(21, seed=1)
    logits = [run.step([("s", prompt)])[0] for run in runs]  # prefill: 21 rows, the dense weights in both
    for _ in range(6):  # one-row decode steps: packed copies in the first model
        token = int(logits[1].argmax())
        logits = [run.step([("s", [token])])[0] for run in runs]
        assert torch.nn.functional.cosine_similarity(logits[0], logits[1], dim=0) > 0.997


def test_real_gemma3_loads_with_the_packed_paths():
    from tests.gemma_package import gemma3_gguf_path

    loaded = load_model(str(gemma3_gguf_path()), dtype=torch.bfloat16)
    layers = loaded.config.num_layers
    kinds = _packed_kinds(loaded.model)
    if not packed_linear.int8_supported(torch.device("cpu"), torch.bfloat16):
        pytest.skip("the native CPU kernels are unavailable")
    # qkv (Q5_0, Q5_0, Q8_0) and gate_up (Q5_0) as int8 blocks of 32, the Q6_K half of ffn_down as blocks of 16;
    # o_proj (Q4_K) and the Q4_K half of ffn_down as int4
    int4 = packed_linear.int4_supported(torch.device("cpu"), torch.bfloat16)
    assert kinds == ({"int8": 2 * layers + layers // 2, "int4": layers + layers // 2} if int4
                     else {"int8": 2 * layers + layers // 2, "dense": layers + layers // 2})
    assert loaded.model.output_int8 is not None
    # where the kernel has a Q5_0 loop, the all-Q5_0 Linears (gate_up; qkv where v is Q5_0 too) keep the file's
    # bytes, with the bits of their int8 form
    q5 = [m for m in loaded.model.modules() if isinstance(m, Linear) and isinstance(m.int8, Q5Blocks)]
    assert len(q5) == (layers + layers // 2 if q5_supported() else 0)
    x = torch.randn(2, loaded.config.hidden_size).bfloat16()
    for linear in q5[:3]:
        codes, scales = q5_to_int8(linear.int8.blocks)
        assert torch.equal(linear.forward(x), q8_matmul_cpu(x, codes, scales, torch.bfloat16))
