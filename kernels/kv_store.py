"""Writing new keys/values into the paged KV cache by slot mapping.

slot = block_id * block_size + offset; a negative slot marks a padding token
that is not written.
"""

from __future__ import annotations

import torch

from kernels._triton import check, check_same_device, jit, kernel_for, next_pow2, tl
from kernels._utils import check_kv_cache


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [T, Hkv, D] -> k_cache/v_cache [num_blocks, block_size, Hkv, D] in place."""
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    k_rows = k_cache.view(-1, num_kv_heads, head_dim)
    v_rows = v_cache.view(-1, num_kv_heads, head_dim)
    slots = slot_mapping if slot_mapping.dtype == torch.int64 else slot_mapping.long()
    if slots.numel() and bool((slots < 0).any()):
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    k_rows.index_copy_(0, slots, key.to(k_cache.dtype))
    v_rows.index_copy_(0, slots, value.to(v_cache.dtype))


@jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cb, stride_cs, stride_ch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per token: copy its [Hkv, D] key and value into the slot.
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token
        return
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    dst = block * stride_cb + offset * stride_cs + heads[:, None] * stride_ch + dims[None, :]
    k = tl.load(key_ptr + t * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=mask)
    v = tl.load(value_ptr + t * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask)
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def check_store_inputs(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> torch.device:
    """The Triton launchers' contract for writing key/value [T, Hkv, D] by slot; -> their device."""
    check_kv_cache(k_cache, v_cache)
    device = check_same_device(key, value, k_cache, v_cache, slot_mapping)
    hkv, dim = k_cache.shape[2], k_cache.shape[3]
    check(key.dim() == 3 and key.shape == value.shape, "key/value must both be [T, Hkv, D]")
    check(tuple(key.shape[1:]) == (hkv, dim), f"key is {tuple(key.shape)}, cache wants [T, {hkv}, {dim}]")
    check(slot_mapping.shape == (key.shape[0],), "slot_mapping must be [T]")
    check(slot_mapping.dtype in (torch.int64, torch.int32), "slot_mapping must be int64 or int32")
    check(key.stride(2) == 1 and value.stride(2) == 1, "key/value head_dim must be contiguous")
    check(key.dtype == k_cache.dtype and value.dtype == v_cache.dtype, "key/value dtype must match the cache")
    return device


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton launcher; same contract as ``store_kv_ref``."""
    device = check_store_inputs(key, value, k_cache, v_cache, slot_mapping)
    _, block_size, hkv, dim = k_cache.shape
    num_tokens = key.shape[0]
    if num_tokens == 0:
        return
    kernel_for(_store_kv_kernel, device)[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        NUM_KV_HEADS=hkv, HEAD_DIM=dim, BLOCK_SIZE=block_size,
        BLOCK_H=next_pow2(hkv), BLOCK_D=next_pow2(dim),
    )
