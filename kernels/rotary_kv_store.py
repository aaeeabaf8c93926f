"""Rotary embedding fused with the K/V cache write: one launch per layer instead of two.

A layer's attention needs its queries rotated and its new keys (rotated) and
values in the paged cache; the rotated keys themselves are read back only from
the cache. So one program per token loads the token's cos/sin once, writes the
rotated query heads to a new tensor, and writes the rotated key heads and the
value heads straight into the token's cache slot (a negative slot is padding:
its query is still rotated, nothing is written to the cache). The unfused pair
(``kernels.rotary`` then ``kernels.kv_store``) launches two kernels and writes
and reads the rotated keys once more; on a small model's decode step the launch
is what counts (SmolLM2-135M: 30 layers, so 30 launches per step fewer), as in
SGLang's rotary kernels that take the KV buffer to fill.

The reference, and the native CPU kernel set, are the two unfused ops in turn.
"""

from __future__ import annotations

from typing import Callable

import torch

from kernels._triton import jit, kernel_for, next_pow2, tl
from kernels.kv_store import check_store_inputs, store_kv_ref
from kernels.rotary import check_rotary_inputs, load_cos_sin, rotary_embedding_ref, rotate_heads


def rotary_then_store(rotary: Callable, store: Callable) -> Callable:
    """The fused op's contract built from a rotary op and a K/V store op of one kernel set."""

    def rotary_and_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            slot_mapping: torch.Tensor) -> torch.Tensor:
        q, k = rotary(positions, q, k, cos_sin_cache)
        store(k, v, k_cache, v_cache, slot_mapping)
        return q

    return rotary_and_store_kv


rotary_and_store_kv_ref = rotary_then_store(rotary_embedding_ref, store_kv_ref)
rotary_and_store_kv_ref.__doc__ = """positions [T], q [T, Hq, D], k/v [T, Hkv, D] -> rotated q (a new tensor); the
rotated k and v written into k_cache/v_cache [num_blocks, block_size, Hkv, D] by slot_mapping [T] (negative:
not written). ``rotary_embedding_ref`` then ``store_kv_ref``."""


@jit
def _rotary_and_store_kv_kernel(
    pos_ptr, q_ptr, k_ptr, v_ptr, cache_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_qot, stride_qoh, stride_cos_sin, stride_cb, stride_cs, stride_ch,
    NUM_Q_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    # One program per token: its query heads rotated into q_out; its key heads rotated and its value heads
    # copied into its cache slot.
    t = tl.program_id(0).to(tl.int64)
    cos, sin = load_cos_sin(cache_ptr, tl.load(pos_ptr + t).to(tl.int64), stride_cos_sin, HALF, BLOCK_HALF)
    rotate_heads(q_ptr + t * stride_qt, q_out_ptr + t * stride_qot, stride_qh, stride_qoh, cos, sin,
                 NUM_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # a padding token: nothing goes into the cache
        return
    at = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs
    rotate_heads(k_ptr + t * stride_kt, k_cache_ptr + at, stride_kh, stride_ch, cos, sin,
                 NUM_KV_HEADS, HALF, BLOCK_HK, BLOCK_HALF)
    heads = tl.arange(0, BLOCK_HK)[:, None]
    dims = tl.arange(0, 2 * BLOCK_HALF)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < 2 * HALF)
    value = tl.load(v_ptr + t * stride_vt + heads * stride_vh + dims, mask=mask)
    tl.store(v_cache_ptr + at + heads * stride_ch + dims, value, mask=mask)


def rotary_and_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                        slot_mapping: torch.Tensor, q_out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton launcher; same contract as ``rotary_and_store_kv_ref``. ``q_out``: a [T, Hq, D] tensor of q's dtype
    (rows contiguous in D) to write the rotated queries into, instead of a new one (prefill_graphs' static
    buffer)."""
    device = check_rotary_inputs(positions, q, k, cos_sin_cache)
    check_store_inputs(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, hq, dim = q.shape
    if q_out is None:
        q_out = torch.empty((num_tokens, hq, dim), dtype=q.dtype, device=device)
    elif not (q_out.shape == q.shape and q_out.dtype == q.dtype and q_out.device == q.device and q_out.stride(2) == 1):
        raise ValueError(f"q_out must be {tuple(q.shape)} {q.dtype} on {q.device} with contiguous heads")
    if num_tokens:
        kernel_for(_rotary_and_store_kv_kernel, device)[(num_tokens,)](
            positions, q, k, v, cos_sin_cache, q_out, k_cache, v_cache, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            q_out.stride(0), q_out.stride(1), cos_sin_cache.stride(0),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            NUM_Q_HEADS=hq, NUM_KV_HEADS=k.shape[1], HALF=dim // 2, BLOCK_SIZE=k_cache.shape[1],
            BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(k.shape[1]), BLOCK_HALF=next_pow2(dim // 2),
        )
    return q_out
