"""The attention layer over the paged KV cache.

It owns no weights: it attends over the layer's cache blocks, which already
hold this step's keys/values (the model writes them by slot mapping, fused with
the rotary embedding: `Ops.rotary_and_store_kv`), through the kernel set
`kernels.dispatch.get_ops(device)` only. Which kernel runs is decided by the
metadata: a decode-only batch takes the single-query paged kernel, anything
else (prefill, chunked prefill, prefix-cache hits) the variable-length prefill
kernel. A mixed batch is split: the model runner puts its one-token sequences
first (`meta.num_decodes`), they take the decode kernel (grouped-query K/V
loads, split-KV) and the prefill kernel starts after them. Sent through the
prefill kernel, a decode row costs a whole query tile per query head there,
and on the CPU the reference's gather-and-pad decode path instead of the
native decode kernel.

In batch-invariant mode (`meta.batch_invariant`) every row takes
`ops.paged_attention_rows` instead: one query row at a time over its own
sequence's keys, the same computation for a row in any step
(kernels/row_attention.py).

A sliding-window layer (``window`` > 0: Mistral's `sliding_window`, Gemma 3's
local layers) passes its window to every kernel: a token at position p attends
to positions p - window + 1 .. p only. When every layer is windowed the block
manager gives back the blocks behind the window: their table entries point at
a null block that every kernel masks or skips (inference.engine.block_manager).
"""

from __future__ import annotations

import torch
from torch import nn

from .attention_metadata import AttentionMetadata


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, window: int = 0) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.window = window

    def forward(self, q: torch.Tensor, kv_cache: tuple[torch.Tensor, torch.Tensor], meta: AttentionMetadata,
                ops) -> torch.Tensor:
        """q [T, Hq, D] (this step's keys/values already in ``kv_cache``) -> [T, Hq * D]."""
        k_cache, v_cache = kv_cache
        window = self.window
        if meta.batch_invariant:
            out = ops.paged_attention_rows(q, k_cache, v_cache, meta.row_block_tables, meta.row_seq_lens, self.scale,
                                           window=window)
        elif meta.decode_only:
            out = ops.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, self.scale,
                                             window=window)
        else:
            decodes = meta.num_decodes
            out = ops.paged_prefill_attention(q, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                                              meta.seq_lens, self.scale, meta.max_query_len, meta.max_seq_len,
                                              first_seq=decodes, window=window)
            if decodes:
                out[:decodes] = ops.paged_decode_attention(q[:decodes], k_cache, v_cache, meta.block_tables[:decodes],
                                                           meta.seq_lens[:decodes], self.scale, window=window)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)
