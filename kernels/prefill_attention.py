"""Prefill / extend attention over the paged KV cache (causal, offset).

q [T, Hq, D] holds the new tokens of B sequences, sequence b owning rows
query_start_loc[b]:query_start_loc[b+1]. Its new tokens sit at positions
seq_lens[b] - q_len_b .. seq_lens[b] - 1 and their K/V are already in the
cache, so a token at position p attends to cached positions 0..p (only
p - window + 1 .. p with a sliding ``window`` > 0). Decode sequences (q_len 1),
chunked prefill and prefix-cache hits all fit this form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._triton import (
    check, check_model_dtype, check_same_device, dot_dtype, dot_precision, jit, kernel_for, next_pow2,
    tl, triton,
)
from kernels._utils import check_kv_cache, gather_blocks
from kernels.paged_decode_attention import paged_decode_attention_ref, window_bound


def _sequence_attention(
    q_seq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_ids: torch.Tensor,
    seq_len: int,
    scale: float,
    window: int = 0,
) -> torch.Tensor:
    q_len, num_heads, head_dim = q_seq.shape
    block_size, hkv = k_cache.shape[1], k_cache.shape[2]
    num_blocks = -(-seq_len // block_size)
    ids = block_ids[:num_blocks]
    keys = gather_blocks(k_cache, ids).view(-1, hkv, head_dim)[:seq_len]
    values = gather_blocks(v_cache, ids).view(-1, hkv, head_dim)[:seq_len]
    query = q_seq.transpose(0, 1).unsqueeze(0)
    key = keys.transpose(0, 1).unsqueeze(0)
    value = values.transpose(0, 1).unsqueeze(0)
    if q_len == seq_len and not window:
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        # Query i sits at position seq_len - q_len + i and sees keys 0..that.
        first = seq_len - q_len
        rows = torch.arange(q_len, device=q_seq.device).view(q_len, 1) + first
        cols = torch.arange(seq_len, device=q_seq.device).view(1, seq_len)
        mask = (cols <= rows) & (cols > rows - window) if window else cols <= rows
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return out.squeeze(0).transpose(0, 1)


def paged_prefill_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    first_seq: int = 0,
    window: int = 0,
) -> torch.Tensor:
    """Reference (and CPU production) prefill attention.

    Sequences with one new token go through the batched decode path in one
    call; every longer query runs PyTorch's fused SDPA on its gathered K/V
    (``is_causal`` when the whole sequence is new, an offset mask otherwise).
    Sequences before ``first_seq`` are skipped and their rows are zero: a
    mixed step's leading decodes, which the caller runs through the decode
    kernel (``inference.engine.attention``).
    """
    check_kv_cache(k_cache, v_cache)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    batch = len(lens)
    _check_first_seq(first_seq, batch)
    out = torch.empty_like(q)
    if first_seq:
        out[:starts[first_seq]] = 0  # the skipped sequences' rows
    singles = [b for b in range(first_seq, batch) if starts[b + 1] - starts[b] == 1]
    if len(singles) == batch and batch == q.shape[0]:
        return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale, window)
    if len(singles) > 1:
        idx = torch.tensor(singles, device=q.device)
        rows = torch.tensor([starts[b] for b in singles], device=q.device)
        out[rows] = paged_decode_attention_ref(
            q.index_select(0, rows),
            k_cache,
            v_cache,
            block_tables.index_select(0, idx),
            seq_lens.index_select(0, idx),
            scale,
            window,
        )
        done = set(singles)
    else:
        done = set()
    for b in range(first_seq, batch):
        start, end = starts[b], starts[b + 1]
        if b in done or end == start:
            continue
        out[start:end] = _sequence_attention(
            q[start:end], k_cache, v_cache, block_tables[b], lens[b], scale, window
        )
    if starts[-1] < q.shape[0]:
        out[starts[-1]:] = 0  # padding rows past the last sequence
    return out


def _check_first_seq(first_seq: int, batch: int) -> None:
    check(0 <= first_seq <= batch, f"first_seq must lie in [0, {batch}], got {first_seq}")


# ---------------------------------------------------------------------------
# Triton: flash attention over the paged cache, one program per (query tile,
# sequence, query head), K/V tiles gathered through the block table.
# ---------------------------------------------------------------------------

_LOG2E = 1.4426950408889634


@jit(do_not_specialize=["first_seq"])  # one compiled kernel for every value
def _paged_prefill_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_ptr, seq_lens_ptr, out_ptr,
    scale_log2, first_seq, window,
    stride_qt, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_bt,
    stride_ot, stride_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    b = (tl.program_id(1) + first_seq).to(tl.int64)
    head = tl.program_id(2)
    q_start = tl.load(query_start_ptr + b)
    q_len = tl.load(query_start_ptr + b + 1) - q_start
    if tile * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + b)
    first_pos = seq_len - q_len  # position of this sequence's first new token
    kv_head = head // GROUP

    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < q_len
    dim_ok = dims < HEAD_DIM
    tokens = (q_start + rows).to(tl.int64)
    q = tl.load(
        q_ptr + tokens[:, None] * stride_qt + head * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
    ).to(DOT_DTYPE)
    q_pos = first_pos + rows

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Keys past the tile's last query position are never visible, nor (a sliding window) keys before its
    # first query's window. Every row sees a key of the first K/V tile (BLOCK_M <= BLOCK_N), so m_i is
    # finite from it on.
    kv_end = tl.minimum(seq_len, first_pos + (tile + 1) * BLOCK_M)
    kv_start = tl.maximum(first_pos + tile * BLOCK_M - window + 1, 0)
    offs_n = tl.arange(0, BLOCK_N)
    for tile_start in range(kv_start, kv_end, BLOCK_N):
        pos = tile_start + offs_n
        tok_ok = pos < kv_end
        block_ids = tl.load(
            block_tables_ptr + b * stride_bt + pos // BLOCK_SIZE, mask=tok_ok, other=0
        ).to(tl.int64)
        kv_off = (
            block_ids[:, None] * stride_cb + (pos % BLOCK_SIZE)[:, None] * stride_cs
            + kv_head * stride_ch + dims[None, :]
        )
        kv_mask = tok_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k.to(DOT_DTYPE)), input_precision=DOT_PRECISION) * scale_log2
        visible = tok_ok[None, :] & (pos[None, :] <= q_pos[:, None]) & (pos[None, :] > q_pos[:, None] - window)
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        pv = tl.dot(p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    result = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        out_ptr + tokens[:, None] * stride_ot + head * stride_oh + dims[None, :],
        result.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & dim_ok[None, :],
    )


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    first_seq: int = 0,
    out: torch.Tensor | None = None,
    window: int = 0,
) -> torch.Tensor:
    """Triton launcher; same contract as ``paged_prefill_attention_ref``. ``out``: a [T, Hq, D] tensor of q's
    dtype (rows contiguous in D) to write into instead of a new zeroed one; the rows this call does not compute
    (the sequences before ``first_seq``, padding) keep what they held (inference.engine.prefill_graphs passes
    its static buffer)."""
    check_kv_cache(k_cache, v_cache)
    device = check_same_device(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens)
    check(q.dim() == 3, f"q must be [T, Hq, D], got {tuple(q.shape)}")
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    check(cache_dim == head_dim, f"q head_dim {head_dim} != cache head_dim {cache_dim}")
    check(num_heads % num_kv_heads == 0, f"Hq {num_heads} is not a multiple of Hkv {num_kv_heads}")
    check(q.dtype == k_cache.dtype, f"q is {q.dtype} but the cache is {k_cache.dtype}")
    check_model_dtype("q", q)
    check(q.stride(2) == 1, "q head_dim must be contiguous")
    batch = seq_lens.shape[0]
    check(seq_lens.dim() == 1 and seq_lens.dtype == torch.int32, "seq_lens must be int32 [B]")
    check(query_start_loc.shape == (batch + 1,) and query_start_loc.dtype == torch.int32,
          "query_start_loc must be int32 [B + 1]")
    check(block_tables.dim() == 2 and block_tables.shape[0] == batch, "block_tables must be [B, M]")
    check(block_tables.dtype == torch.int32 and block_tables.stride(1) == 1, "block_tables must be int32, rows contiguous")
    check(max_query_len >= 0 and max_seq_len >= 0, "max_query_len/max_seq_len must be >= 0")
    _check_first_seq(first_seq, batch)
    if out is None:
        out = torch.zeros_like(q, memory_format=torch.contiguous_format)
    else:
        check(out.shape == q.shape and out.dtype == q.dtype and out.device == q.device and out.stride(2) == 1,
              f"out must be {tuple(q.shape)} {q.dtype} on {q.device} with contiguous heads")
    if num_tokens == 0 or batch == first_seq or max_query_len == 0:
        return out
    block_m = 16 if max_query_len <= 16 else (32 if max_query_len <= 32 else 64)
    grid = (triton.cdiv(max_query_len, block_m), batch - first_seq, num_heads)
    kernel_for(_paged_prefill_attention_kernel, device)[grid](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
        float(scale) * _LOG2E, first_seq, window_bound(window),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
        BLOCK_M=block_m, BLOCK_N=64, BLOCK_D=max(16, next_pow2(head_dim)),
        DOT_DTYPE=dot_dtype(q.dtype, device), DOT_PRECISION=dot_precision(q.dtype),
        num_warps=4,
    )
    return out
