"""Writing new keys/values into the paged KV cache by slot mapping.

slot = block_id * block_size + offset; a negative slot marks a padding token
that is not written.
"""

from __future__ import annotations

import torch

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
