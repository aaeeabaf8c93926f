"""Small helpers shared by the kernels and their references."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check(cond: bool, message: str) -> None:
    """The launchers' input checks: a ValueError with ``message`` unless ``cond``."""
    if not cond:
        raise ValueError(message)


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


def check_decode_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                        seq_lens: torch.Tensor) -> tuple[int, int, int, int, int]:
    """The contract every paged decode-attention launcher checks (Triton and native CPU alike);
    -> (batch, num_heads, head_dim, block_size, num_kv_heads). Layout requirements (strides,
    devices) stay with each launcher.

    Valid inputs take one combined test (this runs once per layer per decode step, and the
    messages below cost microseconds to format); only failing ones go through the checks
    that say what is wrong."""
    if q.dim() == 3 and k_cache.dim() == 4 and block_tables.dim() == 2:
        batch, num_heads, head_dim = q.shape
        _, block_size, num_kv_heads, cache_dim = k_cache.shape
        if (k_cache.shape == v_cache.shape and q.dtype == k_cache.dtype == v_cache.dtype
                and q.dtype in SUPPORTED_DTYPES and k_cache.device == v_cache.device and cache_dim == head_dim
                and num_kv_heads and num_heads % num_kv_heads == 0 and block_tables.shape[0] == batch
                and block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32
                and seq_lens.shape == (batch,) and k_cache.is_contiguous() and v_cache.is_contiguous()):
            return batch, num_heads, head_dim, block_size, num_kv_heads
    check_kv_cache(k_cache, v_cache)
    check(q.dim() == 3, f"q must be [B, Hq, D], got {tuple(q.shape)}")
    batch, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, cache_dim = k_cache.shape
    check(cache_dim == head_dim, f"q head_dim {head_dim} != cache head_dim {cache_dim}")
    check(num_heads % num_kv_heads == 0, f"Hq {num_heads} is not a multiple of Hkv {num_kv_heads}")
    check(q.dtype in SUPPORTED_DTYPES, f"q must be float32, bfloat16 or float16, got {q.dtype}")
    check(q.dtype == k_cache.dtype, f"q is {q.dtype} but the cache is {k_cache.dtype}")
    check(block_tables.dim() == 2 and block_tables.shape[0] == batch and block_tables.dtype == torch.int32,
          f"block_tables must be int32 [B={batch}, M], got {block_tables.dtype} {tuple(block_tables.shape)}")
    check(seq_lens.shape == (batch,) and seq_lens.dtype == torch.int32,
          f"seq_lens must be int32 [B={batch}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    return batch, num_heads, head_dim, block_size, num_kv_heads
