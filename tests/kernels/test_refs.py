"""The PyTorch references (the CPU production path) against plain float64 math."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.activation import silu_and_mul_ref
from kernels.dispatch import get_ops, select_backend
from kernels.kv_store import store_kv_ref
from kernels.paged_decode_attention import paged_decode_attention_ref
from kernels.prefill_attention import paged_prefill_attention_ref
from kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from kernels.rotary import build_cos_sin_cache, rotary_embedding_ref
from kernels.rotary_kv_store import rotary_and_store_kv_ref
from tests.kernels.paged_cases import make_paged_case, naive_attention

ATTN_TOL = {torch.float32: 2e-5, torch.bfloat16: 2.5e-2}
HEADS = [(4, 4), (6, 2), (8, 2), (9, 3)]  # Hq/Hkv ratios 1, 3, 4, 3


def _close(actual, expected, tol):
    diff = (actual.double().cpu() - expected.double().cpu()).abs().max().item()
    assert diff <= tol, f"max abs diff {diff} > {tol}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("block_size", [16, 8])
def test_decode_attention_matches_dense(dtype, heads, block_size):
    seq_lens = [1, 15, 16, 17, 33, 70]
    case = make_paged_case([1] * len(seq_lens), seq_lens, *heads, 32, block_size, dtype, seed=1)
    out = paged_decode_attention_ref(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale
    )
    assert out.shape == case.q.shape and out.dtype == dtype
    _close(out, naive_attention(case), ATTN_TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", HEADS)
def test_prefill_attention_matches_dense_mixed_batch(dtype, heads):
    # whole prompt, chunk on a cached prefix, decodes, a chunk ending mid-block
    q_lens = [19, 5, 1, 1, 16, 1, 7]
    seq_lens = [19, 37, 1, 50, 48, 17, 23]
    case = make_paged_case(q_lens, seq_lens, *heads, 32, 16, dtype, seed=2)
    out = paged_prefill_attention_ref(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
        case.seq_lens, case.scale, case.max_query_len, case.max_seq_len,
    )
    assert out.shape == case.q.shape and out.dtype == dtype
    _close(out, naive_attention(case), ATTN_TOL[dtype])


def test_prefill_single_decode_and_all_decode_paths():
    for q_lens, seq_lens in (([1], [9]), ([1, 1, 1], [3, 40, 16]), ([3, 1], [3, 21])):
        case = make_paged_case(q_lens, seq_lens, 6, 2, 16, 16, torch.float32, seed=3)
        out = paged_prefill_attention_ref(
            case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale, case.max_query_len, case.max_seq_len,
        )
        _close(out, naive_attention(case), 2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_first_seq_skips_the_leading_sequences(dtype):
    """A mixed step's leading decodes are the decode kernel's: rows of sequences before `first_seq` are
    zero, every later row is what the whole call gives (decodes after first_seq included)."""
    q_lens, seq_lens = [1, 1, 1, 19, 5, 1, 7], [40, 17, 1, 19, 37, 50, 23]
    case = make_paged_case(q_lens, seq_lens, 9, 3, 32, 16, dtype, seed=4)
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale, case.max_query_len, case.max_seq_len)
    whole = paged_prefill_attention_ref(*args)
    for first in (0, 2, 3, 6, 7):
        out = paged_prefill_attention_ref(*args, first_seq=first)
        start = sum(q_lens[:first])
        assert not out[:start].any()
        # the later decode may be batched with others or not: rounding can differ, not more
        if start < out.shape[0]:
            _close(out[start:], whole[start:], ATTN_TOL[dtype] / 4)
    with pytest.raises(ValueError, match="first_seq"):
        paged_prefill_attention_ref(*args, first_seq=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_kv_writes_slots_and_skips_negative(dtype):
    blocks, bs, hkv, d = 5, 4, 2, 8
    k_cache = torch.zeros(blocks, bs, hkv, d, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(6, hkv, d).to(dtype)
    value = torch.randn(6, hkv, d).to(dtype)
    slots = torch.tensor([0, 7, -1, 19, 4, -1], dtype=torch.int64)
    store_kv_ref(key, value, k_cache, v_cache, slots)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            assert torch.equal(k_cache[s // bs, s % bs], key[t])
            assert torch.equal(v_cache[s // bs, s % bs], value[t])
    assert int((k_cache.flatten(0, 1).abs().sum((1, 2)) != 0).sum()) == 4
    assert int((v_cache.flatten(0, 1).abs().sum((1, 2)) != 0).sum()) == 4


def _rms64(x, w, eps):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("shape", [(1, 576), (7, 100), (33, 64)])
def test_rms_norm_and_fused_add(dtype, tol, shape):
    x = torch.randn(shape).to(dtype)
    r = torch.randn(shape).to(dtype)
    w = (torch.rand(shape[1]) + 0.5).to(dtype)
    _close(rms_norm_ref(x, w, 1e-6), _rms64(x, w, 1e-6), tol * 2)
    out, new_res = fused_add_rms_norm_ref(x, r, w, 1e-6)
    assert torch.equal(new_res, x + r)
    _close(out, _rms64(new_res, w, 1e-6), tol * 2)
    assert out.dtype == dtype and new_res.dtype == dtype


def test_rotary_matches_complex_rotation_and_hf_layout():
    head_dim, theta = 16, 10000.0
    cache = build_cos_sin_cache(head_dim, 64, theta, "cpu")
    assert cache.shape == (64, head_dim) and cache.dtype == torch.float32
    positions = torch.tensor([0, 3, 17, 63, 5])
    q = torch.randn(5, 6, head_dim)
    k = torch.randn(5, 2, head_dim)
    q_out, k_out = rotary_embedding_ref(positions, q, k, cache)
    half = head_dim // 2
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2).double() / head_dim)
    ang = positions.double()[:, None] * inv[None]  # [T, half]
    for x, y in ((q, q_out), (k, k_out)):
        z = torch.complex(x[..., :half].double(), x[..., half:].double())
        rot = z * torch.polar(torch.ones_like(ang), ang)[:, None, :]
        expected = torch.cat((rot.real, rot.imag), dim=-1)
        _close(y, expected, 1e-5)
    # position 0 is the identity
    assert torch.allclose(q_out[0], q[0])


def test_rotary_and_store_kv_rotates_q_and_caches_rotated_k_and_v():
    head_dim, theta, bs = 16, 10000.0, 4
    cache = build_cos_sin_cache(head_dim, 64, theta, "cpu")
    positions = torch.tensor([0, 3, 17, 63, 5])
    q, k, v = torch.randn(5, 6, head_dim), torch.randn(5, 2, head_dim), torch.randn(5, 2, head_dim)
    k_cache = torch.zeros(4, bs, 2, head_dim)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([9, -1, 0, 15, 6])
    q_out = rotary_and_store_kv_ref(positions, q, k, v, cache, k_cache, v_cache, slots)
    half = head_dim // 2
    ang = positions.double()[:, None] / theta ** (torch.arange(0, head_dim, 2).double() / head_dim)[None]

    def rotated(x):
        z = torch.complex(x[..., :half].double(), x[..., half:].double()) * torch.polar(torch.ones_like(ang), ang)[:, None]
        return torch.cat((z.real, z.imag), dim=-1)

    _close(q_out, rotated(q), 1e-5)
    k_rot = rotated(k)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            _close(k_cache[slot // bs, slot % bs], k_rot[t], 1e-5)
            assert torch.equal(v_cache[slot // bs, slot % bs], v[t])
    written = k_cache.flatten(0, 1).abs().sum((1, 2)) != 0
    assert written.tolist() == [i in (9, 0, 15, 6) for i in range(16)]  # the padding token wrote nothing


def test_rotary_bfloat16_close_to_float32():
    cache = build_cos_sin_cache(64, 4096, 100000.0, "cpu")
    positions = torch.randint(0, 4096, (11,))
    q, k = torch.randn(11, 9, 64), torch.randn(11, 3, 64)
    qf, kf = rotary_embedding_ref(positions, q, k, cache)
    qb, kb = rotary_embedding_ref(positions, q.bfloat16(), k.bfloat16(), cache)
    assert qb.dtype == torch.bfloat16
    _close(qb, qf, 3e-2)
    _close(kb, kf, 3e-2)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_silu_and_mul(dtype, tol):
    x = torch.randn(13, 2 * 37).to(dtype)
    xd = x.double()
    expected = F.silu(xd[:, :37]) * xd[:, 37:]
    out = silu_and_mul_ref(x)
    assert out.shape == (13, 37) and out.dtype == dtype
    _close(out, expected, tol * 4)


def test_dispatch_picks_refs_on_cpu(kernel_config):
    kernel_config(backend="ref")
    ops = get_ops(torch.device("cpu"))
    assert ops.backend == "ref"
    assert ops.paged_decode_attention is paged_decode_attention_ref
    assert ops.store_kv is store_kv_ref
    assert ops.rotary_and_store_kv is rotary_and_store_kv_ref
    assert select_backend("cuda") == "ref"
    with pytest.raises(ValueError, match="ref, cpu, triton, auto"):
        kernel_config(backend="bogus")
    assert select_backend("cpu") == "ref"  # a refused configuration leaves the last one in force


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_chunked_large_mixed_batch(dtype, monkeypatch):
    from kernels import paged_decode_attention as pda

    gen = torch.Generator().manual_seed(5)
    seq_lens = torch.randint(1, 140, (40,), generator=gen).tolist()
    case = make_paged_case([1] * 40, seq_lens, 6, 2, 16, 16, dtype, seed=4)
    token_bytes = 2 * 16 * case.k_cache.element_size()
    monkeypatch.setattr(pda, "CHUNK_BYTES", 30 * 16 * token_bytes)  # force several chunks
    pda._last_plan.plan = None
    chunks = pda.plan_chunks(seq_lens, 16, token_bytes)
    assert len(chunks) > 1 and sorted(i for c in chunks for i in c) == list(range(40))
    out = paged_decode_attention_ref(
        case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale
    )
    _close(out, naive_attention(case), ATTN_TOL[dtype])


def test_plan_chunks_bounds_padded_bytes_and_sorts_by_length():
    from kernels.paged_decode_attention import plan_chunks

    lens = [500, 20, 130, 640, 7, 300] * 8
    chunks = plan_chunks(lens, 16, 384, chunk_bytes=3 << 20)
    assert sorted(i for c in chunks for i in c) == list(range(len(lens)))
    for chunk in chunks:
        longest = max(-(-lens[i] // 16) * 16 for i in chunk)
        assert len(chunk) == 1 or len(chunk) * longest * 384 <= 3 << 20
    flat = [lens[i] for c in chunks for i in c]
    assert flat == sorted(flat)
    assert len(plan_chunks([512] * 8, 16, 384)) == 1
    assert len(plan_chunks([100000], 16, 384)) == 1  # one sequence over budget is its own chunk


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_fused_qk_view_matches_separate(dtype):
    """q and k sliced from one qkv buffer take the single-pass path; same numbers."""
    cache = build_cos_sin_cache(64, 512, 10000.0, "cpu")
    qkv = torch.randn(5, (9 + 2 * 3) * 64).to(dtype)
    q = qkv[:, : 9 * 64].view(5, 9, 64)
    k = qkv[:, 9 * 64 : 12 * 64].view(5, 3, 64)
    positions = torch.tensor([0, 1, 100, 511, 7])
    q_joint, k_joint = rotary_embedding_ref(positions, q, k, cache)
    q_sep, k_sep = rotary_embedding_ref(positions, q.clone(), k.clone(), cache)
    assert torch.equal(q_joint, q_sep) and torch.equal(k_joint, k_sep)
    assert q_joint.shape == q.shape and k_joint.shape == k.shape


def test_rotary_fp32_bitwise_equal_to_hf_formula():
    cache = build_cos_sin_cache(64, 256, 100000.0, "cpu")
    positions = torch.randint(0, 256, (6,))
    q, k = torch.randn(6, 9, 64), torch.randn(6, 3, 64)
    cos = torch.cat([cache[positions, :32]] * 2, -1).unsqueeze(1)
    sin = torch.cat([cache[positions, 32:]] * 2, -1).unsqueeze(1)

    def rotate_half(x):
        return torch.cat((-x[..., 32:], x[..., :32]), dim=-1)

    q_out, k_out = rotary_embedding_ref(positions, q, k, cache)
    assert torch.equal(q_out, q * cos + rotate_half(q) * sin)
    assert torch.equal(k_out, k * cos + rotate_half(k) * sin)


def test_decode_plan_is_reused_and_rebuilt_on_change():
    from kernels.paged_decode_attention import decode_plan

    case = make_paged_case([1] * 20, list(range(5, 105, 5)), 4, 2, 16, 16, torch.float32, seed=6)
    first = decode_plan(case.block_tables, case.seq_lens, 16, 128)
    assert decode_plan(case.block_tables.clone(), case.seq_lens.clone(), 16, 128) is first
    lens = case.seq_lens.clone()
    lens[3] += 1  # still inside its blocks
    assert decode_plan(case.block_tables, lens, 16, 128) is not first
    out = paged_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.block_tables, lens, case.scale)
    case.seq_lens = lens
    _close(out, naive_attention(case), ATTN_TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_bitwise_equal_to_hf_formula(dtype):
    x = torch.randn(5, 576).to(dtype)
    w = torch.randn(576).to(dtype)
    xf = x.float()
    expected = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype)
    before = x.clone()
    assert torch.equal(rms_norm_ref(x, w, 1e-5), expected)
    assert torch.equal(x, before)  # the input is not modified
