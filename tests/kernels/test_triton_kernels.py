"""Each Triton launcher against its PyTorch reference on random inputs.

``device`` is "cpu" (Triton interpreter, small shapes, fast) or "cuda"
(compiled kernels, real model shapes); see conftest.py.
"""

from __future__ import annotations

import pytest
import torch

from kernels.activation import silu_and_mul, silu_and_mul_ref
from kernels.dispatch import get_ops
from kernels.kv_store import store_kv, store_kv_ref
from kernels.paged_decode_attention import paged_decode_attention, paged_decode_attention_ref
from kernels.prefill_attention import paged_prefill_attention, paged_prefill_attention_ref
from kernels.rms_norm import fused_add_rms_norm, fused_add_rms_norm_ref, rms_norm, rms_norm_ref
from kernels.rotary import build_cos_sin_cache, rotary_embedding, rotary_embedding_ref
from kernels.rotary_kv_store import rotary_and_store_kv, rotary_and_store_kv_ref
from tests.kernels.paged_cases import make_paged_case

DTYPES = [torch.float32, torch.bfloat16]
ATTN_TOL = {torch.float32: 3e-5, torch.bfloat16: 2e-2}
# (Hq, Hkv): ratios 1, 3, 4 and the SmolLM2 / Llama-3.2-1B layouts
HEADS = [(4, 4), (6, 2), (8, 2), (9, 3), (32, 8)]


def assert_close(actual, expected, atol, rtol=0.0):
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), atol=atol, rtol=rtol)


def fused_qkv(num_tokens, hq, hkv, dim, dtype, device, gen):
    """A random fused QKV projection output and q [T, Hq, D], k and v [T, Hkv, D] as its column slices,
    as the model passes them (strided rows) -> (qkv, q, k, v)."""
    qkv = torch.randn(num_tokens, (hq + 2 * hkv) * dim, generator=gen).to(dtype).to(device)
    q, k, v = qkv.split((hq * dim, hkv * dim, hkv * dim), dim=-1)
    return qkv, q.view(num_tokens, hq, dim), k.view(num_tokens, hkv, dim), v.view(num_tokens, hkv, dim)


def _decode_lens(device, gen):
    if device == "cpu":
        return [1, 15, 16, 17, 49, 130]
    return torch.randint(1, 1500, (48,), generator=gen).tolist() + [1, 16, 1024, 2047]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("num_splits", [1, 3, None])
def test_decode_attention(device, dtype, heads, num_splits):
    gen = torch.Generator().manual_seed(10 * HEADS.index(heads) + (num_splits or 0))
    lens = _decode_lens(device, gen)
    dim = 32 if device == "cpu" else 64
    case = make_paged_case([1] * len(lens), lens, *heads, dim, 16, dtype, device, seed=7)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    out = paged_decode_attention(*args, num_splits=num_splits)
    assert_close(out, paged_decode_attention_ref(*args), ATTN_TOL[dtype])


def test_decode_attention_odd_head_dim_and_block_size(device):
    lens = [3, 20, 41]
    case = make_paged_case([1] * 3, lens, 6, 2, 40, 8, torch.float32, device, seed=8)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    for splits in (1, 2):
        out = paged_decode_attention(*args, num_splits=splits)
        assert_close(out, paged_decode_attention_ref(*args), ATTN_TOL[torch.float32])


def _prefill_case(device, dtype, heads, seed):
    if device == "cpu":
        # whole prompt, chunk on a cached prefix, decodes, chunk ending mid-block
        q_lens, seq_lens, dim = [19, 5, 1, 1, 16, 1, 70], [19, 37, 1, 50, 48, 17, 90], 32
    else:
        q_lens = [512, 333, 1, 1, 100, 1, 7, 1024]
        seq_lens = [512, 1000, 77, 1500, 100, 9, 519, 2048]
        dim = 64
    return make_paged_case(q_lens, seq_lens, *heads, dim, 16, dtype, device, seed=seed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(4, 4), (9, 3), (8, 2)])
def test_prefill_attention_mixed_batch(device, dtype, heads):
    case = _prefill_case(device, dtype, heads, seed=9)
    args = (
        case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
        case.seq_lens, case.scale, case.max_query_len, case.max_seq_len,
    )
    assert_close(paged_prefill_attention(*args), paged_prefill_attention_ref(*args), ATTN_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3), (8, 2)])
def test_prefill_attention_after_leading_decodes(device, dtype, heads):
    """`first_seq`: the launcher skips a mixed step's leading decodes (their rows stay zero) and matches
    the reference on the rest, whose own later decodes included."""
    if device == "cpu":
        q_lens, seq_lens, dim = [1, 1, 1, 19, 5, 1, 70], [40, 17, 1, 19, 37, 50, 90], 32
    else:
        q_lens = [1] * 200 + [512, 333, 1, 100]
        seq_lens = torch.randint(1, 1500, (200,), generator=torch.Generator().manual_seed(5)).tolist()
        seq_lens += [512, 1000, 1500, 100]
        dim = 64
    case = make_paged_case(q_lens, seq_lens, *heads, dim, 16, dtype, device, seed=11)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale, case.max_query_len, case.max_seq_len)
    first = 3 if device == "cpu" else 200  # the leading decodes
    out = paged_prefill_attention(*args, first_seq=first)
    assert_close(out, paged_prefill_attention_ref(*args, first_seq=first), ATTN_TOL[dtype])
    assert not out[:first].any()
    assert not paged_prefill_attention(*args, first_seq=len(q_lens)).any()  # nothing left: all zero


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv(device, dtype):
    blocks, bs, hkv, dim = (7, 16, 3, 24) if device == "cpu" else (4096, 16, 8, 64)
    num_tokens = 13 if device == "cpu" else 3000
    gen = torch.Generator().manual_seed(3)
    # key/value as column slices of a fused qkv output (non-contiguous rows)
    qkv = torch.randn(num_tokens, (2 + 2) * hkv * dim, generator=gen).to(dtype).to(device)
    key = qkv[:, 2 * hkv * dim : 3 * hkv * dim].view(num_tokens, hkv, dim)
    value = qkv[:, 3 * hkv * dim :].view(num_tokens, hkv, dim)
    slots = torch.randperm(blocks * bs, generator=gen)[:num_tokens]
    slots[::4] = -1  # padding tokens
    slots = slots.to(device)
    caches = [torch.randn(blocks, bs, hkv, dim, generator=gen).to(dtype).to(device) for _ in range(2)]
    expected = [c.clone() for c in caches]
    store_kv(key, value, caches[0], caches[1], slots)
    store_kv_ref(key, value, expected[0], expected[1], slots)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
def test_rms_norm_and_fused_add(device, dtype, tol):
    shapes = [(1, 576), (7, 100), (33, 64)] if device == "cpu" else [(1, 576), (4097, 2048), (333, 576)]
    gen = torch.Generator().manual_seed(4)
    for rows, hidden in shapes:
        x = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
        r = torch.randn(rows, hidden, generator=gen).to(dtype).to(device)
        w = (torch.rand(hidden, generator=gen) + 0.5).to(dtype).to(device)
        assert_close(rms_norm(x, w, 1e-5), rms_norm_ref(x, w, 1e-5), tol, tol)
        out, new_res = fused_add_rms_norm(x, r, w, 1e-5)
        ref_out, ref_res = fused_add_rms_norm_ref(x, r, w, 1e-5)
        if device == "cuda" or dtype == torch.float32:
            assert torch.equal(new_res, ref_res)
        else:  # the interpreter truncates float32 -> bfloat16 instead of rounding to nearest
            assert_close(new_res, ref_res, 1e-6, 2**-7)
        assert_close(out, ref_out, tol, tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
def test_rotary_embedding(device, dtype, tol):
    num_tokens, hq, hkv, dim = (7, 9, 3, 64) if device == "cpu" else (1031, 32, 8, 64)
    gen = torch.Generator().manual_seed(5)
    cache = build_cos_sin_cache(dim, 4096, 500000.0, device)
    positions = torch.randint(0, 4096, (num_tokens,), generator=gen).to(device)
    _, q, k, _ = fused_qkv(num_tokens, hq, hkv, dim, dtype, device, gen)
    q_out, k_out = rotary_embedding(positions, q, k, cache)
    q_ref, k_ref = rotary_embedding_ref(positions, q, k, cache)
    assert_close(q_out, q_ref, tol, tol)
    assert_close(k_out, k_ref, tol, tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
@pytest.mark.parametrize("heads", [(9, 3), (4, 1), (32, 8)])
def test_rotary_and_store_kv(device, dtype, tol, heads):
    hq, hkv = heads
    dim = 24 if device == "cpu" else 64  # 24: half of it (12) is not a power of two
    blocks, bs, num_tokens = (6, 16, 11) if device == "cpu" else (2048, 16, 3001)
    gen = torch.Generator().manual_seed(7)
    cache = build_cos_sin_cache(dim, 4096, 500000.0, device)
    positions = torch.randint(0, 4096, (num_tokens,), generator=gen).to(device)
    qkv, q, k, v = fused_qkv(num_tokens, hq, hkv, dim, dtype, device, gen)
    slots = torch.randperm(blocks * bs, generator=gen)[:num_tokens]
    slots[1::5] = -1  # padding tokens: rotated q, nothing in the cache
    slots = slots.to(device)
    caches = [torch.randn(blocks, bs, hkv, dim, generator=gen).to(dtype).to(device) for _ in range(2)]
    expected = [c.clone() for c in caches]
    before = qkv.clone()
    q_out = rotary_and_store_kv(positions, q, k, v, cache, caches[0], caches[1], slots)
    q_ref = rotary_and_store_kv_ref(positions, q, k, v, cache, expected[0], expected[1], slots)
    assert torch.equal(qkv, before)  # inputs untouched
    assert_close(q_out, q_ref, tol, tol)
    assert_close(caches[0], expected[0], tol, tol)
    assert torch.equal(caches[1], expected[1])  # values are copied, not computed
    untouched = torch.ones(blocks * bs, dtype=torch.bool)
    untouched[slots[slots >= 0].cpu()] = False
    assert torch.equal(caches[0].view(blocks * bs, -1)[untouched.to(device)],
                       expected[0].view(blocks * bs, -1)[untouched.to(device)])


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])
def test_silu_and_mul(device, dtype, tol):
    shapes = [(5, 74), (1, 3072)] if device == "cpu" else [(4099, 2 * 8192), (3, 3072)]
    gen = torch.Generator().manual_seed(6)
    for rows, width in shapes:
        x = torch.randn(rows, width, generator=gen).to(dtype).to(device)
        assert_close(silu_and_mul(x), silu_and_mul_ref(x), tol, tol)


def test_launchers_reject_bad_inputs(device):
    case = make_paged_case([1, 1], [5, 9], 4, 2, 16, 16, torch.float32, device)
    with pytest.raises(ValueError, match="int32"):
        paged_decode_attention(case.q, case.k_cache, case.v_cache, case.block_tables.long(),
                               case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="multiple"):
        paged_decode_attention(case.q[:, :3], case.k_cache, case.v_cache, case.block_tables,
                               case.seq_lens, case.scale)
    with pytest.raises(ValueError, match="dtype"):
        store_kv(case.q[:, :2].double(), case.q[:, :2].double(), case.k_cache, case.v_cache,
                 torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValueError):
        rms_norm(case.q, torch.ones(16, device=device), 1e-5)
    k = case.q[:, :2].contiguous()
    cos_sin = build_cos_sin_cache(16, 64, 1e4, device)
    with pytest.raises(ValueError, match="slot_mapping"):
        rotary_and_store_kv(torch.zeros(2, dtype=torch.int64, device=device), case.q, k, k, cos_sin,
                            case.k_cache, case.v_cache, torch.zeros(3, dtype=torch.int64, device=device))
    with pytest.raises(ValueError, match="positions"):
        rotary_and_store_kv(torch.zeros(3, dtype=torch.int64, device=device), case.q, k, k, cos_sin,
                            case.k_cache, case.v_cache, torch.zeros(2, dtype=torch.int64, device=device))


def test_dispatch_forced_triton(device, kernel_config):
    kernel_config(backend="triton")
    ops = get_ops(device)
    assert ops.backend == "triton"
    assert ops.paged_decode_attention is paged_decode_attention
    assert ops.paged_prefill_attention is paged_prefill_attention
    assert ops.store_kv is store_kv and ops.silu_and_mul is silu_and_mul
    assert ops.rotary_and_store_kv is rotary_and_store_kv
    kernel_config(backend="auto")
    assert get_ops(device).backend in (("triton",) if device == "cuda" else ("cpu", "ref"))
