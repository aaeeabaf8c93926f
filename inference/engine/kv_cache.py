"""Preallocated paged KV cache: per layer a key and a value tensor of
[num_blocks, block_size, num_kv_heads, head_dim] in the model dtype."""

from __future__ import annotations

import math
import mmap

import torch

from .model_config import ModelConfig


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values together."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


def num_blocks_for_budget(config: ModelConfig, budget_bytes: int, block_size: int, dtype: torch.dtype) -> int:
    """How many whole blocks fit in `budget_bytes`."""
    return int(budget_bytes) // kv_bytes_per_block(config, block_size, dtype)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor. On the CPU, from an anonymous memory map: the kernel hands out zero pages as they are first
    touched, so a cache of several GiB costs nothing at start (torch.zeros writes every byte: about 2.6 s per GiB
    on a 2-core VM) and takes memory as the blocks fill. The tensor keeps the map alive."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    element = torch.empty((), dtype=dtype).element_size()
    count = math.prod(shape)
    return torch.frombuffer(mmap.mmap(-1, count * element), dtype=dtype, count=count).view(shape)


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device | str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One zero-filled (k_cache, v_cache) pair per layer (zeros, so unread padding never holds NaNs)."""
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"need positive num_blocks and block_size, got {num_blocks} and {block_size}")
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    device = torch.device(device)
    return [(_zeros(shape, dtype, device), _zeros(shape, dtype, device)) for _ in range(config.num_layers)]
