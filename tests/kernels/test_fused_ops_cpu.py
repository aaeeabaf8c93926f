"""The native CPU fused ops (kernels/csrc/fused_ops.c) against their PyTorch references."""

from __future__ import annotations

import pytest
import torch

from kernels import fused_ops_cpu as fused
from kernels.activation import gelu_tanh_and_mul_ref, silu_and_mul_ref
from kernels.dispatch import _ops
from kernels.kv_store import store_kv_ref
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.rotary import build_cos_sin_cache, rotary_embedding_ref
from kernels.rotary_kv_store import rotary_and_store_kv_ref

pytestmark = pytest.mark.skipif(fused.library() is None, reason="no C compiler: the native CPU ops cannot be built")

DTYPES = [torch.float32, torch.bfloat16]


def assert_close_to_ref(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16: a last-bit difference in an intermediate rounding may move the result by up to two units in
    the last place, and only rarely; float32: 1e-6 relative."""
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    if ref.dtype == torch.float32:
        torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
        return
    diff = (ours.float() - ref.float()).abs()
    two_ulp = ref.float().abs().clamp_min(1e-30) * 2.0 ** -6
    assert bool((diff <= two_ulp).all()), f"max diff {diff.max().item()}"
    assert (ours != ref).float().mean().item() < 0.01


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [(1, 576), (7, 64), (64, 576), (3, 1000), (300, 2048)])
def test_rms_norm_matches_reference(dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype) * 3
    residual = torch.randn(rows, hidden, generator=g).to(dtype)
    weight = torch.randn(hidden, generator=g).to(dtype)
    assert_close_to_ref(fused.rms_norm_cpu(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5))
    out, new_res = fused.fused_add_rms_norm_cpu(x, residual, weight, 1e-6)
    ref_out, ref_res = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    assert torch.equal(new_res, ref_res)  # one rounded add: exact
    assert_close_to_ref(out, ref_out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_strided_rows_and_float32_weight(dtype):
    wide = torch.randn(5, 1200).to(dtype)
    x = wide[:, 100:676]  # rows 1200 elements apart
    weight = torch.rand(576) + 0.5  # float32 weight with a bf16 input: converted like the reference
    assert_close_to_ref(fused.rms_norm_cpu(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,hq,hkv,dim", [(1, 9, 3, 64), (33, 4, 4, 128), (5, 8, 1, 80), (2, 3, 1, 6)])
def test_rotary_matches_reference_joint_and_separate(dtype, tokens, hq, hkv, dim):
    g = torch.Generator().manual_seed(tokens + dim)
    qkv = torch.randn(tokens, (hq + 2 * hkv) * dim, generator=g).to(dtype)
    q = qkv[:, : hq * dim].view(tokens, hq, dim)
    k = qkv[:, hq * dim: (hq + hkv) * dim].view(tokens, hkv, dim)
    cache = build_cos_sin_cache(dim, 4096, 10000.0)
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    for qq, kk in ((q, k), (q.clone(), k.clone().transpose(0, 1).contiguous().transpose(0, 1))):
        ours, ref = fused.rotary_embedding_cpu(positions, qq, kk, cache), rotary_embedding_ref(positions, qq, kk, cache)
        assert torch.equal(ours[0], ref[0]) and torch.equal(ours[1], ref[1])  # no FMA: bit-identical
    assert torch.equal(q, qkv[:, : hq * dim].view(tokens, hq, dim))  # inputs untouched


def test_rotary_rejects_positions_outside_the_cache():
    q, k = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    cache = build_cos_sin_cache(8, 16, 10000.0)
    for bad in ([3, 16], [-1, 0]):
        with pytest.raises(IndexError, match="outside the cos/sin cache"):
            fused.rotary_embedding_cpu(torch.tensor(bad), q, k, cache)
    qkv = torch.randn(2, 4 * 8, dtype=torch.bfloat16)  # the joint (fused qkv) path checks too
    with pytest.raises(IndexError, match="outside the cos/sin cache"):
        fused.rotary_embedding_cpu(torch.tensor([0, 99]), qkv[:, :16].view(2, 2, 8), qkv[:, 16:24].view(2, 1, 8), cache)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 1536), (64, 1536), (3, 17), (200, 4096)])
def test_silu_and_mul_matches_reference(dtype, rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    x = (torch.randn(rows, 2 * inter, generator=g) * 4).to(dtype)
    assert_close_to_ref(fused.silu_and_mul_cpu(x), silu_and_mul_ref(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_and_mul_at_the_exp_clamp(dtype):
    gate = torch.tensor([-200.0, -90.0, -87.5, 88.5, 90.0, 1e4, 0.0, -0.0])
    x = torch.cat((gate, torch.full_like(gate, 3.0))).view(1, -1).to(dtype)
    torch.testing.assert_close(fused.silu_and_mul_cpu(x), silu_and_mul_ref(x), rtol=1e-6, atol=1e-30)


def test_silu_vector_lanes_equal_the_scalar_tail():
    """A row of 15: 8 lanes go through the vector loop (AVX2 builds), 7 through the scalar tail; the two
    compute the same operations in the same order, so every output equals the first bit for bit."""
    values = [-200.0, -87.0, -86.9, -20.0, -1.5, -1e-3, 0.0, 1e-3, 0.7, 3.0, 30.0, 87.9, 88.0, 300.0]
    values += torch.randn(50, generator=torch.Generator().manual_seed(3)).mul(8).tolist()
    for value in values:
        x = torch.cat((torch.full((15,), value), torch.full((15,), 1.25))).view(1, -1)
        out = fused.silu_and_mul_cpu(x)[0]
        assert torch.equal(out, out[:1].expand(15)), value


def _gelu_tanh_exact(gate: torch.Tensor) -> torch.Tensor:
    g = gate.double()
    return g / (1.0 + torch.exp(-2.0 * (2.0 / torch.pi) ** 0.5 * (g + 0.044715 * g ** 3)))


@pytest.mark.parametrize("rows,inter", [(1, 2048), (64, 1536), (3, 17), (200, 4096)])
def test_gelu_tanh_and_mul_matches_reference(rows, inter):
    """bf16: each output within two units in the last place of PyTorch's, rarely different where the gate is
    above -4. Below, PyTorch's 1 + tanh(u) cancels (tanh(u) near -1) and its tiny activations are often a unit
    off; ours (g * sigmoid(2u), no cancellation) is the float64 GELU rounded once almost everywhere."""
    g = torch.Generator().manual_seed(rows + inter)
    x = (torch.randn(rows, 2 * inter, generator=g) * 4).to(torch.bfloat16)
    ours, ref = fused.gelu_tanh_and_mul_cpu(x), gelu_tanh_and_mul_ref(x)
    assert ours.dtype == ref.dtype == torch.bfloat16 and ours.shape == ref.shape
    diff = (ours.float() - ref.float()).abs()
    assert bool((diff <= ref.float().abs() * 2.0 ** -6 + 1e-5).all()), f"max diff {diff.max().item()}"
    away = x[:, :inter] >= -4
    assert (ours != ref)[away].float().mean().item() < 0.01
    ones = torch.cat((x[:, :inter], torch.ones_like(x[:, inter:])), dim=1)  # up = 1: the activation alone
    exact = _gelu_tanh_exact(x[:, :inter]).to(torch.bfloat16)
    assert (fused.gelu_tanh_and_mul_cpu(ones) == exact).float().mean().item() > 0.99


def test_gelu_tanh_and_mul_extremes_and_float32():
    gate = torch.tensor([-200.0, -90.0, -40.0, -6.0, -1.5, -1e-3, 0.0, -0.0, 1e-3, 0.7, 3.0, 30.0, 90.0, 1e4])
    x = torch.cat((gate, torch.full_like(gate, 3.0))).view(1, -1)
    torch.testing.assert_close(fused.gelu_tanh_and_mul_cpu(x.bfloat16()).float(),
                               gelu_tanh_and_mul_ref(x.bfloat16()).float(), rtol=2.0 ** -7, atol=1e-6)
    assert torch.equal(fused.gelu_tanh_and_mul_cpu(x), gelu_tanh_and_mul_ref(x))  # float32: the reference


def test_gelu_vector_lanes_equal_the_scalar_tail():
    """As test_silu_vector_lanes_equal_the_scalar_tail: the same operations in the vector loop and the tail."""
    values = [-200.0, -87.0, -20.0, -4.2, -1.5, -1e-3, 0.0, 1e-3, 0.7, 3.0, 30.0, 300.0]
    values += torch.randn(40, generator=torch.Generator().manual_seed(4)).mul(6).tolist()
    for value in values:
        x = torch.cat((torch.full((15,), value), torch.full((15,), 1.25))).view(1, -1).bfloat16()
        out = fused.gelu_tanh_and_mul_cpu(x)[0]
        assert torch.equal(out, out[:1].expand(15)), value


def test_the_cpu_kernel_set_runs_gemma_mlp_natively():
    assert _ops("cpu").gelu_tanh_and_mul is fused.gelu_tanh_and_mul_cpu
    assert _ops("ref").gelu_tanh_and_mul is gelu_tanh_and_mul_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_store_kv_matches_reference_and_skips_padding(dtype):
    g = torch.Generator().manual_seed(0)
    blocks, block_size, hkv, dim, tokens = 6, 4, 3, 8, 7
    qkv = torch.randn(tokens, 5 * hkv * dim, generator=g).to(dtype)
    key = qkv[:, : hkv * dim].view(tokens, hkv, dim)  # strided rows, as in the model
    value = qkv[:, 2 * hkv * dim: 3 * hkv * dim].view(tokens, hkv, dim)
    slots = torch.tensor([5, 0, -1, 23, 9, -1, 12])
    caches = [torch.zeros(blocks, block_size, hkv, dim, dtype=dtype) for _ in range(4)]
    fused.store_kv_cpu(key, value, caches[0], caches[1], slots)
    store_kv_ref(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    with pytest.raises(IndexError):
        fused.store_kv_cpu(key, value, caches[0], caches[1], torch.tensor([0, 1, 2, 3, 4, 5, 24]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_and_store_kv_is_the_reference_bit_for_bit(dtype):
    """The native set's fused op is its rotary then its K/V store: the CPU path's outputs are unchanged."""
    g = torch.Generator().manual_seed(1)
    tokens, hq, hkv, dim = 7, 9, 3, 64
    qkv = torch.randn(tokens, (hq + 2 * hkv) * dim, generator=g).to(dtype)
    q, k, v = qkv.split((hq * dim, hkv * dim, hkv * dim), dim=-1)
    q, k, v = q.view(tokens, hq, dim), k.view(tokens, hkv, dim), v.view(tokens, hkv, dim)
    cache = build_cos_sin_cache(dim, 4096, 10000.0)
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    slots = torch.tensor([5, 0, -1, 23, 9, -1, 12])
    caches = [torch.zeros(6, 4, hkv, dim, dtype=dtype) for _ in range(4)]
    ours = _ops("cpu").rotary_and_store_kv(positions, q, k, v, cache, caches[0], caches[1], slots)
    ref = rotary_and_store_kv_ref(positions, q, k, v, cache, caches[2], caches[3], slots)
    assert torch.equal(ours, ref)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert caches[0].any() and caches[1].any()


def test_unsupported_inputs_fall_back_to_the_reference():
    x = torch.randn(3, 64, dtype=torch.float16)
    weight = torch.randn(64, dtype=torch.float16)
    assert torch.equal(fused.rms_norm_cpu(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5))
    wide = torch.randn(2, 2 * (fused.MAX_HIDDEN + 2))
    assert torch.equal(fused.silu_and_mul_cpu(wide), silu_and_mul_ref(wide))


def _argmax_cases() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(5, 262_144, generator=g)
    rows[1, 7] = rows[1, 200_000] = 50.0  # ties: the first
    rows[2, -1] = 60.0  # in the tail past the last 16
    rows[3] = float("-inf")  # all -inf: index 0
    rows[4, 9] = rows[4, 77] = float("nan")  # a NaN wins, the first one
    odd = torch.randn(3, 37, generator=g)
    odd[1, 36] = 9.0
    odd[2, 0], odd[2, 5] = -0.0, 0.0
    odd[2, 1:] = -1.0
    odd[2, 5] = 0.0
    return [rows, odd, torch.randn(1, 16, generator=g), torch.randn(2, 1, generator=g), rows[:, ::2]]


def test_argmax_is_torch_max_indices():
    """Greedy sampling's argmax (inference.engine.sampler): each row's first maximum, NaN first, as PyTorch's
    max(dim=-1).indices gives it; strided and other-dtype rows go to PyTorch."""
    for logits in _argmax_cases():
        assert torch.equal(fused.argmax_cpu(logits), logits.max(dim=-1).indices), logits.shape
    for logits in _argmax_cases()[:2]:
        for sub in (logits[1:3], logits[:1]):  # row views: a row stride of the parent
            assert torch.equal(fused.argmax_cpu(sub), sub.max(dim=-1).indices)
    half = _argmax_cases()[0].bfloat16()
    assert torch.equal(fused.argmax_cpu(half), half.max(dim=-1).indices)


def test_argmax_in_a_build_without_avx512(fresh_loader, kernel_config):
    """The scalar loops (a build with AVX-512 turned off, or a CPU without it) give the same indices."""
    from kernels import cpu_native

    kernel_config(cc=f"{cpu_native.find_compiler()} -mno-avx512f")
    for logits in _argmax_cases():
        assert torch.equal(fused.argmax_cpu(logits), logits.max(dim=-1).indices), logits.shape
