"""Per-step attention metadata, passed explicitly from the model runner to
every attention layer (no module globals).

A step runs a flattened batch of T new tokens from B sequences, sequence b
owning tokens query_start_loc[b]:query_start_loc[b+1]. Sequence b has
seq_lens[b] tokens in its KV cache after this step's tokens are written, so
its new tokens sit at positions seq_lens[b] - q_len_b ... seq_lens[b] - 1 and
each attends causally to every cached position up to its own.

KV cache layout, per layer: k_cache and v_cache, each
[num_blocks, block_size, num_kv_heads, head_dim]; slot s = block_id *
block_size + offset. The block manager owns block ids; block_tables maps a
sequence's logical block i to a physical block id.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    query_start_loc: torch.Tensor  # int32 [B + 1]
    seq_lens: torch.Tensor  # int32 [B]
    block_tables: torch.Tensor  # int32 [B, max_blocks_per_seq]; unused entries 0
    slot_mapping: torch.Tensor  # int64 [T]; a negative slot is padding and is not written
    max_query_len: int
    max_seq_len: int
    decode_only: bool  # every sequence has exactly one new token
    # The first num_decodes sequences have one new token each (rows 0..num_decodes-1): a mixed step's
    # decodes, which the attention layer sends to the decode kernel. 0: no such prefix is promised.
    num_decodes: int = 0
    # Batch-invariant mode (inference.engine.invariant_mode): matmuls through ops.fixed_matmul and
    # attention one row at a time, each row over its own sequence's block table (row_block_tables
    # [T, max_blocks_per_seq]) up to its own position (row_seq_lens [T] int32: position + 1).
    batch_invariant: bool = False
    row_block_tables: torch.Tensor | None = None
    row_seq_lens: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])
