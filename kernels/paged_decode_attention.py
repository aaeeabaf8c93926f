"""Paged decode attention: one query token per sequence over its cached K/V.

q [B, Hq, D]; k_cache/v_cache [num_blocks, block_size, Hkv, D]; block_tables
[B, M] int32; seq_lens [B] int32 (the current token's K/V is already stored).
Grouped-query attention: query head h reads KV head h // (Hq // Hkv).
``window`` > 0 (a sliding-window layer): the query at position p = seq_len - 1
sees only keys p - window + 1 .. p (transformers' and llama.cpp's convention).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernels._triton import (
    check, check_same_device, dot_dtype, dot_precision, jit, kernel_for, next_pow2, tl,
)
from kernels._utils import check_decode_inputs, check_kv_cache, gather_blocks


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


# Gathered K (and V) per chunk are kept around this size so that SDPA reads
# them back from cache rather than DRAM, as it must after one batch-wide gather
# at large batches (the slower of the two on the CPUs this path serves).
CHUNK_BYTES = 3 << 20


def plan_chunks(lens: list[int], block_size: int, token_bytes: int,
                chunk_bytes: int | None = None) -> list[list[int]]:
    """Split a decode batch (by index) into chunks of similar length.

    Sequences are sorted by length and cut greedily into runs whose gathered,
    padded K stays within ``chunk_bytes``; each chunk is padded only to its own
    longest member, so mixed context lengths pay little for padding.
    """
    budget = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    order = sorted(range(len(lens)), key=lens.__getitem__)
    chunks: list[list[int]] = []
    current: list[int] = []
    for i in order:
        padded = -(-lens[i] // block_size) * block_size  # ascending: i is the longest so far
        if current and (len(current) + 1) * padded * token_bytes > budget:
            chunks.append(current)
            current = []
        current.append(i)
    if current:
        chunks.append(current)
    return chunks


@dataclass(frozen=True)
class _Group:
    rows: torch.Tensor | None  # int64 rows of the batch in this group; None = the whole batch
    block_ids: torch.Tensor  # int64 [b * num_blocks], row-major
    num_blocks: int
    mask: torch.Tensor  # bool [b, 1, 1, num_blocks * block_size]: True = a real token
    lengths: torch.Tensor  # [b] the group's seq_lens
    windowed: dict = field(default_factory=dict)  # window -> mask of the last `window` tokens only

    def mask_for(self, window: int) -> torch.Tensor:
        if not window:
            return self.mask
        mask = self.windowed.get(window)
        if mask is None:
            padded = self.mask.shape[-1]
            first = (self.lengths - window).view(-1, 1)
            mask = self.mask & (torch.arange(padded, device=first.device).view(1, padded) >= first).view(
                self.mask.shape)
            self.windowed[window] = mask
        return mask


@dataclass(frozen=True)
class DecodePlan:
    """Everything about a decode batch that does not depend on the layer.

    Built once per step: every layer of a step passes the same block tables
    and lengths, so ``decode_plan`` hands back the last plan while they are
    equal (compared by value, so in-place updates are never missed).
    """

    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    block_size: int
    token_bytes: int
    groups: tuple[_Group, ...]


_last_plan = threading.local()


def decode_plan(block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int,
                token_bytes: int) -> DecodePlan:
    """The plan for this batch; ``token_bytes`` is one token's K bytes (Hkv * D * itemsize)."""
    last = getattr(_last_plan, "plan", None)
    if (
        last is not None
        and last.block_size == block_size
        and last.token_bytes == token_bytes
        and last.seq_lens.shape == seq_lens.shape
        and last.block_tables.shape == block_tables.shape
        and last.seq_lens.device == seq_lens.device
        and last.seq_lens.dtype == seq_lens.dtype
        and last.block_tables.dtype == block_tables.dtype
        and torch.equal(last.seq_lens, seq_lens)
        and torch.equal(last.block_tables, block_tables)
    ):
        return last
    lens = seq_lens.tolist()
    members = plan_chunks(lens, block_size, token_bytes)
    groups = []
    device = seq_lens.device
    for group in members:
        whole = len(members) == 1
        rows = None if whole else torch.tensor(group, dtype=torch.int64, device=device)
        num_blocks = -(-max(lens[i] for i in group) // block_size)
        tables = block_tables if whole else block_tables.index_select(0, rows)
        lengths = seq_lens if whole else seq_lens.index_select(0, rows)
        padded = num_blocks * block_size
        mask = torch.arange(padded, device=device).view(1, padded) < lengths.view(-1, 1)
        groups.append(_Group(
            rows=rows,
            block_ids=tables[:, :num_blocks].reshape(-1).to(torch.int64),
            num_blocks=num_blocks,
            mask=mask.view(len(group), 1, 1, padded),
            lengths=lengths.clone(),
        ))
    plan = DecodePlan(block_tables.clone(), seq_lens.clone(), block_size, token_bytes, tuple(groups))
    _last_plan.plan = plan
    return plan


def _attend_group(q, k_cache, v_cache, group: _Group, scale: float, window: int = 0) -> torch.Tensor:
    batch, num_heads, head_dim = q.shape
    _, block_size, hkv, _ = k_cache.shape
    padded = group.num_blocks * block_size
    keys = gather_blocks(k_cache, group.block_ids).view(batch, padded, hkv, head_dim)
    values = gather_blocks(v_cache, group.block_ids).view(batch, padded, hkv, head_dim)
    out = F.scaled_dot_product_attention(
        q.view(batch, num_heads, 1, head_dim),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=group.mask_for(window),
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
    window: int = 0,
) -> torch.Tensor:
    """Reference (and CPU production) decode attention.

    Sequences are sorted by length and cut into cache-sized chunks
    (``plan_chunks``); each chunk's blocks are gathered into a padded
    [b, L, Hkv, D] tensor and PyTorch's fused SDPA runs with a key-padding mask. GQA is handled by SDPA (``enable_gqa``), so K/V are
    never repeated per query head; the softmax accumulates in float32.
    """
    check_kv_cache(k_cache, v_cache)
    if q.shape[0] == 0:
        return q.new_empty(q.shape)
    token_bytes = k_cache.shape[2] * k_cache.shape[3] * k_cache.element_size()
    plan = decode_plan(block_tables, seq_lens, k_cache.shape[1], token_bytes)
    if len(plan.groups) == 1:
        return _attend_group(q, k_cache, v_cache, plan.groups[0], scale, window)
    out = torch.empty_like(q)
    for group in plan.groups:
        part = _attend_group(q.index_select(0, group.rows), k_cache, v_cache, group, scale, window)
        out.index_copy_(0, group.rows, part)
    return out


# ---------------------------------------------------------------------------
# Triton: split-KV (flash-decoding) with all query heads of a KV head sharing
# each K/V tile load, then a log-sum-exp merge of the splits.
# ---------------------------------------------------------------------------

_LOG2E = 1.4426950408889634


@jit
def _paged_decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr,
    scale_log2, window,
    stride_qb, stride_qh,
    stride_cb, stride_cs, stride_ch,
    stride_bt,
    stride_ob, stride_oh,
    stride_pb, stride_ph, stride_ps,
    stride_lb, stride_lh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + b)

    # The visible keys are lo .. seq_len - 1 (lo > 0 only in a sliding window). This split's token range,
    # in whole tiles from lo; trailing splits may be empty.
    lo = tl.maximum(seq_len - window, 0)
    tiles = (seq_len - lo + BLOCK_N - 1) // BLOCK_N
    tiles_per_split = (tiles + NUM_SPLITS - 1) // NUM_SPLITS
    start = lo + split * tiles_per_split * BLOCK_N
    end = tl.minimum(start + tiles_per_split * BLOCK_N, seq_len)

    rows = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < GROUP
    dim_ok = dims < HEAD_DIM
    heads = kv_head * GROUP + rows
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + dims[None, :],
        mask=row_ok[:, None] & dim_ok[None, :], other=0.0,
    ).to(DOT_DTYPE)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    for tile_start in range(start, end, BLOCK_N):
        pos = tile_start + offs_n
        tok_ok = pos < end
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
        scores = tl.where(tok_ok[None, :], scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # P is rounded to the cache dtype for the second product, as on the GPU.
        pv = tl.dot(p.to(v.dtype).to(DOT_DTYPE), v.to(DOT_DTYPE), input_precision=DOT_PRECISION)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    safe_l = tl.where(l_i > 0, l_i, 1.0)
    result = acc / safe_l[:, None]
    out_mask = row_ok[:, None] & dim_ok[None, :]
    if NUM_SPLITS == 1:
        tl.store(
            out_ptr + b * stride_ob + heads[:, None] * stride_oh + dims[None, :],
            result.to(out_ptr.dtype.element_ty), mask=out_mask,
        )
    else:
        tl.store(
            part_out_ptr + b * stride_pb + heads[:, None] * stride_ph + split * stride_ps
            + dims[None, :],
            result, mask=out_mask,
        )
        # log2-domain log-sum-exp of this split; -inf when the split is empty
        lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
        tl.store(part_lse_ptr + b * stride_lb + heads * stride_lh + split, lse, mask=row_ok)


@jit
def _paged_decode_merge_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_ok = splits < NUM_SPLITS
    lse = tl.load(part_lse_ptr + b * stride_lb + h * stride_lh + splits, mask=split_ok,
                  other=float("-inf"))
    top = tl.max(lse, axis=0)
    weights = tl.exp2(lse - top)  # empty splits weigh 0
    weights = weights / tl.sum(weights, axis=0)
    parts = tl.load(
        part_out_ptr + b * stride_pb + h * stride_ph + splits[:, None] * stride_ps + dims[None, :],
        mask=split_ok[:, None] & (dims[None, :] < HEAD_DIM), other=0.0,
    )
    merged = tl.sum(parts * weights[:, None], axis=0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dims, merged.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def window_bound(window: int) -> int:
    """The kernels' window argument: ``window``, or one larger than any position when there is none (0)."""
    if window < 0:
        raise ValueError(f"window must be >= 0, got {window}")
    return int(window) if window else 1 << 30


def choose_num_splits(batch: int, num_kv_heads: int, max_blocks: int, block_size: int,
                      device: torch.device) -> int:
    """Enough programs to fill the GPU, never a split shorter than 128 tokens.

    Depends only on shapes (block table width, not the live lengths), so it
    needs no device sync and stays fixed for a captured graph.
    """
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4
    want = -(-2 * sms // max(1, batch * num_kv_heads))
    most = max(1, (max_blocks * block_size) // 128)
    return int(max(1, min(want, most, 64)))


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
    *,
    window: int = 0,
    block_n: int = 64,
    num_warps: int = 4,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Triton launcher; same contract as ``paged_decode_attention_ref``.

    ``num_splits``, ``block_n`` (tokens per tile), ``num_warps`` and ``num_stages`` are tuning knobs
    (benchmarks/decode_attention_sweep.py); the defaults are what the engine uses.
    """
    batch, num_heads, head_dim, block_size, num_kv_heads = check_decode_inputs(q, k_cache, v_cache, block_tables,
                                                                               seq_lens)
    device = check_same_device(q, k_cache, v_cache, block_tables, seq_lens)
    check(q.stride(2) == 1, "q head_dim must be contiguous")
    check(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    check(block_n >= 16 and block_n & (block_n - 1) == 0, f"block_n must be a power of two >= 16, got {block_n}")
    out = torch.empty((batch, num_heads, head_dim), dtype=q.dtype, device=device)
    if batch == 0:
        return out
    group = num_heads // num_kv_heads
    splits = num_splits or choose_num_splits(batch, num_kv_heads, block_tables.shape[1], block_size, device)
    block_d = max(16, next_pow2(head_dim))
    if splits > 1:
        part_out = torch.empty((batch, num_heads, splits, head_dim), dtype=torch.float32, device=device)
        part_lse = torch.empty((batch, num_heads, splits), dtype=torch.float32, device=device)
    else:
        part_out = out.new_empty((1, 1, 1, 1), dtype=torch.float32)
        part_lse = out.new_empty((1, 1, 1), dtype=torch.float32)
    kernel_for(_paged_decode_attention_kernel, device)[(batch, num_kv_heads, splits)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_out, part_lse,
        float(scale) * _LOG2E, window_bound(window),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        part_out.stride(0), part_out.stride(1), part_out.stride(2),
        part_lse.stride(0), part_lse.stride(1),
        GROUP=group, HEAD_DIM=head_dim, BLOCK_SIZE=block_size, NUM_SPLITS=splits,
        BLOCK_G=max(16, next_pow2(group)), BLOCK_N=block_n, BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype(q.dtype, device), DOT_PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, **({} if num_stages is None else {"num_stages": num_stages}),
    )
    if splits > 1:
        kernel_for(_paged_decode_merge_kernel, device)[(batch, num_heads)](
            part_out, part_lse, out,
            part_out.stride(0), part_out.stride(1), part_out.stride(2),
            part_lse.stride(0), part_lse.stride(1), out.stride(0), out.stride(1),
            HEAD_DIM=head_dim, NUM_SPLITS=splits, BLOCK_S=next_pow2(splits), BLOCK_D=block_d,
        )
    return out
