"""Preallocated paged KV cache: per layer a key and a value tensor of
[num_blocks, block_size, num_kv_heads, head_dim] in the model dtype."""

from __future__ import annotations

import torch

from .model_config import ModelConfig


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one block takes across all layers, keys and values together."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


def num_blocks_for_budget(config: ModelConfig, budget_bytes: int, block_size: int, dtype: torch.dtype) -> int:
    """How many whole blocks fit in `budget_bytes`."""
    return int(budget_bytes) // kv_bytes_per_block(config, block_size, dtype)


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device | str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One zero-filled (k_cache, v_cache) pair per layer (zeros, so unread padding never holds NaNs)."""
    if num_blocks <= 0 or block_size <= 0:
        raise ValueError(f"need positive num_blocks and block_size, got {num_blocks} and {block_size}")
    shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(config.num_layers)]
