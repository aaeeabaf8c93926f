"""Small helpers shared by the kernels and their references."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """Copy whole KV blocks ``cache[block_ids]`` -> [len(block_ids), block_size, Hkv, D].

    One ``index_select`` over rows of a whole block. The rows are reinterpreted
    as a 4- or 8-byte integer type first: PyTorch's CPU ``index_select`` is
    vectorised for those but several times slower for bfloat16 rows.
    """
    num_blocks = cache.shape[0]
    rows = cache.reshape(num_blocks, -1)
    row_bytes = rows.shape[1] * rows.element_size()
    ids = block_ids.reshape(-1)
    if ids.dtype != torch.int64:
        ids = ids.long()
    for wide in (torch.int64, torch.int32):
        width = torch.empty((), dtype=wide).element_size()
        if row_bytes % width == 0 and rows.storage_offset() * rows.element_size() % width == 0:
            picked = rows.view(wide).index_select(0, ids).view(cache.dtype)
            return picked.view(ids.shape[0], *cache.shape[1:])
    return rows.index_select(0, ids).view(ids.shape[0], *cache.shape[1:])


def check_kv_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache/v_cache must both be [num_blocks, block_size, Hkv, D]; got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    if k_cache.dtype != v_cache.dtype or k_cache.device != v_cache.device:
        raise ValueError("k_cache and v_cache must share dtype and device")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("KV caches must be contiguous")
