"""Prefill / extend attention over the paged KV cache (causal, offset).

q [T, Hq, D] holds the new tokens of B sequences, sequence b owning rows
query_start_loc[b]:query_start_loc[b+1]. Its new tokens sit at positions
seq_lens[b] - q_len_b .. seq_lens[b] - 1 and their K/V are already in the
cache, so a token at position p attends to cached positions 0..p. Decode
sequences (q_len 1), chunked prefill and prefix-cache hits all fit this form.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._utils import check_kv_cache, gather_blocks
from kernels.paged_decode_attention import paged_decode_attention_ref


def _sequence_attention(
    q_seq: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_ids: torch.Tensor,
    seq_len: int,
    scale: float,
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
    if q_len == seq_len:
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        # Query i sits at position seq_len - q_len + i and sees keys 0..that.
        first = seq_len - q_len
        rows = torch.arange(q_len, device=q_seq.device).view(q_len, 1) + first
        cols = torch.arange(seq_len, device=q_seq.device).view(1, seq_len)
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=cols <= rows, scale=scale, enable_gqa=True
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
) -> torch.Tensor:
    """Reference (and CPU production) prefill attention.

    Sequences with one new token go through the batched decode path in one
    call; every longer query runs PyTorch's fused SDPA on its gathered K/V
    (``is_causal`` when the whole sequence is new, an offset mask otherwise).
    """
    check_kv_cache(k_cache, v_cache)
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    batch = len(lens)
    singles = [b for b in range(batch) if starts[b + 1] - starts[b] == 1]
    if len(singles) == batch and batch == q.shape[0]:
        return paged_decode_attention_ref(q, k_cache, v_cache, block_tables, seq_lens, scale)
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
        )
        done = set(singles)
    else:
        done = set()
    for b in range(batch):
        start, end = starts[b], starts[b + 1]
        if b in done or end == start:
            continue
        out[start:end] = _sequence_attention(
            q[start:end], k_cache, v_cache, block_tables[b], lens[b], scale
        )
    if starts[-1] < q.shape[0]:
        out[starts[-1]:] = 0  # padding rows past the last sequence
    return out
