"""Paged decode attention: one query token per sequence over its cached K/V.

q [B, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D]; block_tables
[B, M] int32; seq_lens [B] int32 (the current token's K/V is already stored).
Grouped-query attention: query head h reads KV head h // (Hq // Hkv).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._utils import check_kv_cache, gather_blocks


def gather_padded_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    num_blocks: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V of each sequence as padded [B, num_blocks * block_size, Hkv, D]."""
    batch = block_tables.shape[0]
    ids = block_tables[:, :num_blocks]
    _, block_size, hkv, dim = k_cache.shape
    keys = gather_blocks(k_cache, ids).view(batch, num_blocks * block_size, hkv, dim)
    values = gather_blocks(v_cache, ids).view(batch, num_blocks * block_size, hkv, dim)
    return keys, values


# One extra bucket costs about as much as gathering and attending this many
# (sequence, block) pairs on a 2-core CPU; measured, see benchmarks/kernels.py.
_BUCKET_CALL_COST = 48


def plan_buckets(lens: list[int], block_size: int, max_buckets: int = 4) -> list[list[int]]:
    """Split sequences (by index) into up to ``max_buckets`` groups of similar length.

    Each group is padded only to its own longest member, so a batch of mixed
    context lengths does not pay for padding everything to the global maximum.
    Tries 1..max_buckets equal-count splits of the length-sorted batch and keeps
    the cheapest (padded blocks plus a fixed cost per extra group).
    """
    n = len(lens)
    order = sorted(range(n), key=lens.__getitem__)
    blocks = [-(-lens[i] // block_size) for i in order]
    best_cost, best_bounds = n * blocks[-1], [0, n]
    for k in range(2, min(max_buckets, n // 8) + 1):
        bounds = [round(n * j / k) for j in range(k + 1)]
        cost = (k - 1) * _BUCKET_CALL_COST + sum(
            (bounds[j + 1] - bounds[j]) * blocks[bounds[j + 1] - 1] for j in range(k)
        )
        if cost < best_cost:
            best_cost, best_bounds = cost, bounds
    return [order[a:b] for a, b in zip(best_bounds, best_bounds[1:])]


def _decode_dense(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
) -> torch.Tensor:
    batch, num_heads, head_dim = q.shape
    block_size = k_cache.shape[1]
    num_blocks = -(-max_len // block_size)
    keys, values = gather_padded_kv(k_cache, v_cache, block_tables, num_blocks)
    padded = num_blocks * block_size
    positions = torch.arange(padded, device=q.device)
    mask = (positions.view(1, padded) < seq_lens.view(batch, 1)).view(batch, 1, 1, padded)
    out = F.scaled_dot_product_attention(
        q.view(batch, num_heads, 1, head_dim),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out.view(batch, num_heads, head_dim)


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Reference (and CPU production) decode attention.

    Sequences are grouped by length (``plan_buckets``); each group's blocks are
    gathered into a padded [b, L, Hkv, D] tensor and PyTorch's fused SDPA runs
    with a key-padding mask. GQA is handled by SDPA (``enable_gqa``), so K/V are
    never repeated per query head; the softmax accumulates in float32.
    """
    check_kv_cache(k_cache, v_cache)
    if q.shape[0] == 0:
        return q.new_empty(q.shape)
    lens = seq_lens.tolist()
    buckets = plan_buckets(lens, k_cache.shape[1]) if len(lens) >= 16 else [None]
    if len(buckets) == 1:
        return _decode_dense(q, k_cache, v_cache, block_tables, seq_lens, max(lens), scale)
    out = torch.empty_like(q)
    for members in buckets:
        idx = torch.tensor(members, device=q.device)
        part = _decode_dense(
            q.index_select(0, idx),
            k_cache,
            v_cache,
            block_tables.index_select(0, idx),
            seq_lens.index_select(0, idx),
            max(lens[i] for i in members),
            scale,
        )
        out.index_copy_(0, idx, part)
    return out
